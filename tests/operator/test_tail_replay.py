"""`pgferry tail` and `pgferry replay` against a real relay, receivers and the CLI in a subprocess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import click
import orjson

import pgferry
from tests.helpers import MakeReceiver, RunningRelay, eventually, pgferry_env
from tests.operator.conftest import cli


class _Rollback(Exception):
    pass


async def test_tail_prints_committed_events_in_commit_order_and_pins_nothing(
    pgferry_cmd: list[str], db_url: str, relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    before = await ferry.publish("s", {"n": "before the tail started"})
    proc = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "tail", "s", "--json", "--count", "3", "--timeout", "30",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=pgferry_env(db_url),
    )  # fmt: skip
    try:

        async def listening() -> bool:
            # Connected is not enough: the tail starts after the newest tick when it has read it
            # (its first `latest_tick`); on a loaded machine the writes below came before that.
            n = await conn.fetchval(
                "select count(*) from pg_stat_activity where application_name = 'pgferry tail'"
                " and query like '%max(id) from ferry.ticks%'"
            )
            return bool(n == 1)

        await eventually(listening, what="the tail to connect")
        assert await conn.fetchval("select count(*) from ferry.consumers") == 0, "a tail must not register a consumer"
        # A transaction that writes first and commits last: its event must come last.
        late = await asyncpg.connect(db_url)
        try:
            tx = late.transaction()
            await tx.start()
            late_id = await late.fetchval("""select ferry.publish('s', '{"n": "late"}')""")
            try:
                async with conn.transaction():
                    await conn.execute("""select ferry.publish('s', '{"n": "rolled back"}')""")
                    raise _Rollback
            except _Rollback:
                pass
            first = await ferry.publish("s", {"n": 1})
            second = await ferry.publish("s", {"n": 2})
            await ferry.publish("elsewhere", {"n": "other stream"})
            await asyncio.sleep(0.3)  # let a tick pass between the commits
            await tx.commit()
        finally:
            await late.close()
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    lines = [orjson.loads(line) for line in out.decode().splitlines()]
    assert [line["stream"] for line in lines] == ["s"] * 3
    ids = [line["id"] for line in lines]
    assert before not in ids
    assert ids == [first, second, late_id], ids
    assert late_id < first
    assert orjson.loads((await cli(pgferry_cmd, db_url, "consumers", "--json")).stdout) == []
    assert b"no events have been written" not in err
    # A stream nothing wrote (a typo?) looked like a quiet one: the tail says so, as `subscription add` does.
    typo = await cli(pgferry_cmd, db_url, "tail", "s", "ss", "--timeout", "0.5")
    assert typo.returncode == 0 and typo.stderr.count("no events have been written") == 1, typo.stderr
    assert 'stream "ss" yet; check the spelling' in typo.stderr and "tail prints its events once" in typo.stderr


async def test_tail_without_a_relay_says_that_events_come_with_a_relay(pgferry_cmd: list[str], db_url: str) -> None:
    """It printed nothing and exited 0 at --timeout, unsaid (outside probe): no relay, no ticks."""
    alone = await cli(pgferry_cmd, db_url, "tail", "s", "--timeout", "0.5")
    assert alone.returncode == 0 and alone.stdout == "", alone
    assert "warning: no relay is running; events show here once one takes ticks" in alone.stderr, alone.stderr


async def test_replay_since_and_from_event_resends_passed_events_with_their_webhook_ids(
    pgferry_cmd: list[str],
    db_url: str,
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:
    from pgferry.receiver import Respond

    receiver, url = await receiver_factory()
    _, broken_url = await receiver_factory(lambda _: Respond(500, b"no"))
    await ferry.subscribe("hook", ["s"], url)
    await ferry.subscribe("broken", ["s"], broken_url, max_attempts=1)
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(5)])

    async def settled() -> bool:
        dead = await conn.fetchval("select count(*) from ferry.dead_letters")
        return bool(len(receiver.received) == 5 and dead == 5)

    await eventually(settled, what="five deliveries and five dead letters")
    originals = sorted(r.headers["webhook-id"] for r in receiver.received)

    replayed = await cli(pgferry_cmd, db_url, "replay", "hook", "--since", "10m", "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert orjson.loads(replayed.stdout) == {"matched": 5, "queued": 5, "skipped": 0}

    async def redelivered() -> bool:
        return len(receiver.received) == 10

    await eventually(redelivered, what="the replayed events")
    assert sorted(r.headers["webhook-id"] for r in receiver.received[5:]) == originals

    async def recorded() -> bool:  # answers reach the receiver before their results commit
        return await conn.fetchval("select count(*) from ferry.retries") == 0  # type: ignore[no-any-return]

    await eventually(recorded, what="the replayed deliveries to be recorded")

    # From an event id, in chunks of one, with the progress bar and a summary.
    partial = await cli(pgferry_cmd, db_url, "replay", "hook", "--from-event", str(ids[3]), "--chunk", "1", "--yes")
    assert partial.returncode == 0, partial.stderr
    assert "2 event(s) queued for delivery again, 0 skipped" in partial.stdout

    async def twelve() -> bool:
        return len(receiver.received) == 12

    await eventually(twelve, what="two more")
    assert [orjson.loads(r.body)["n"] for r in receiver.received[10:]] in ([3, 4], [4, 3])

    # Dead letters are not replayed from the log: `dlq replay` is for them.
    skipped = orjson.loads((await cli(pgferry_cmd, db_url, "replay", "broken", "--since", "1h", "--json")).stdout)
    assert skipped == {"matched": 5, "queued": 0, "skipped": 5}

    both = await cli(pgferry_cmd, db_url, "replay", "hook", "--since", "1h", "--from-event", "1")
    assert both.returncode == 2 and "exactly one of --since or --from-event" in both.stderr
    nope = await cli(pgferry_cmd, db_url, "replay", "nope", "--since", "1h", "--yes")
    assert nope.returncode == 1 and "subscription 'nope' does not exist" in nope.stderr


async def test_replay_on_an_ordered_subscription_keeps_per_key_order_with_the_live_stream(
    pgferry_cmd: list[str],
    db_url: str,
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["s"], url, ordered=True)
    e1 = await ferry.publish("s", {"n": 1}, key="A")
    await ferry.publish("s", {"n": 2}, key="A")

    async def two() -> bool:
        return len(receiver.received) == 2

    await eventually(two, what="two deliveries")
    await ferry.pause("hook")

    async def released() -> bool:
        owned = await conn.fetchval("select owned from ferry.relays")
        return owned is not None and "hook" not in owned

    await eventually(released, what="the relay to stop delivering the paused subscription")
    replayed = orjson.loads(
        (await cli(pgferry_cmd, db_url, "replay", "hook", "--from-event", str(e1), "--json")).stdout
    )
    assert replayed["queued"] == 2
    await ferry.publish("s", {"n": 3}, key="A")  # live, after the replay was queued
    await ferry.resume("hook")

    async def five() -> bool:
        return len(receiver.received) == 5

    await eventually(five, what="replayed and live events")
    assert [orjson.loads(r.body)["n"] for r in receiver.received] == [1, 2, 1, 2, 3]


async def test_replay_walks_tick_ranges_once_and_stops_at_the_cursor_it_started_from(
    conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    from pgferry.ops import inspect
    from tests.helpers import tick

    await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/")  # no relay: nothing is delivered
    ids = []
    for n in range(5):
        ids.append(await ferry.publish("s", {"n": n}))
        await ferry.publish("other", {"n": n})
        await tick(conn)
    while (batch := await conn.fetchrow("select * from ferry.next_batch('webhook:hook')")) is not None:
        await conn.execute("select ferry.finish_batch('webhook:hook', $1)", batch["batch_id"])  # the cursor passes them
    assert await inspect.replay_count(conn, "hook", None, ids[1]) == 4

    chunks = []
    async for step in inspect.replay(conn, "hook", from_event=ids[1], chunk=2):
        chunks.append((step.queued, step.skipped, step.done))
        if len(chunks) == 1:  # committed while the replay runs, and passed by the cursor: not replayed
            later = await ferry.publish("s", {"n": "later"})
            await tick(conn)
            batch = await conn.fetchrow("select * from ferry.next_batch('webhook:hook')")
            await conn.execute("select ferry.finish_batch('webhook:hook', $1)", batch["batch_id"])
    assert chunks[-1] == (0, 0, True) and len(chunks) >= 3, chunks  # several tick ranges, then done
    assert sum(q for q, _, _ in chunks) == 4
    parked = [r["event_id"] for r in await conn.fetch("select event_id from ferry.retries order by event_id")]
    assert parked == ids[1:] and later not in parked
    # Again: what is already queued is skipped; the cursor now covers the later event too.
    again = [step async for step in inspect.replay(conn, "hook", from_event=ids[1], chunk=1000)]
    assert sum(s.skipped for s in again) == 4 and sum(s.queued for s in again) == 1


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths |= _command_paths(command, (*prefix, name))
        else:
            paths.add((*prefix, name))
    return paths


#: commands that never read the ferry schema of the database they are given
_NO_SCHEMA_NEEDED = {
    ("install",),  # creates it
    ("subscription", "secret"),  # no database at all
    ("bench", "capture"),  # the benchmarks install into a scratch database of their own
    ("bench", "webhooks"),
    ("bench", "scale"),
    ("bench", "filter"),
    ("bench", "soak"),
    ("bench", "outage"),
    ("bench", "stream-writes"),
    ("bench", "streams"),
    ("bench", "backfill"),
    ("bench", "fanout"),
    ("bench", "sinks"),
    ("bench", "memory"),
    ("bench", "http"),  # no database at all
    ("run-child",),  # hidden: a child of `run --processes N`, whose supervisor checks the schema first
}


async def test_tail_and_every_other_command_say_in_one_line_that_the_schema_is_missing(
    pgferry_cmd: list[str], empty_db_url: str, tmp_path: Path
) -> None:
    from pgferry.cli import main

    plan = tmp_path / "pgferry.toml"
    plan.write_text('[subscriptions.x]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n')
    args = {
        ("apply",): [str(plan)],
        ("backfill",): ["--list"],
        ("capture",): ["x"],
        ("consumers",): [],
        ("dlq", "discard"): ["x"],
        ("dlq", "list"): [],
        ("dlq", "replay"): ["x"],
        ("dlq", "show"): ["1"],
        ("relays",): [],
        ("replay",): ["x", "--since", "1h", "--yes"],
        ("retention", "set"): ["--max-age", "7 days"],
        ("retention", "show"): [],
        ("run",): ["--exit-after", "20"],
        ("status",): [],
        ("subscription", "add"): ["x", "--url", "http://127.0.0.1:9/", "--stream", "s"],
        ("subscription", "credentials"): ["x", "--user", "u"],
        ("subscription", "list"): [],
        ("subscription", "pause"): ["x"],
        ("subscription", "remove"): ["x"],
        ("subscription", "resume"): ["x"],
        ("tail",): ["s", "--timeout", "20"],
        ("token", "create"): ["x", "--read", "*"],
        ("token", "list"): [],
        ("token", "revoke"): ["x"],
        ("trace",): ["1"],
    }
    assert _command_paths(main) == set(args) | _NO_SCHEMA_NEEDED, "a new command: say what it needs here"
    database = empty_db_url.rsplit("/", 1)[1]
    expected = (
        f"Error: the pgferry schema is not installed in database '{database}'; "
        "run `pgferry install --database-url URL` first"
    )
    limit = asyncio.Semaphore(4)  # two cores, shared

    async def run(path: tuple[str, ...]) -> tuple[tuple[str, ...], int, str]:
        async with limit:
            done = await cli(pgferry_cmd, empty_db_url, *path, *args[path])
        return path, done.returncode, done.stderr

    for path, code, err in await asyncio.gather(*(run(p) for p in sorted(args))):
        assert (code, err.strip()) == (1, expected), f"pgferry {' '.join(path)}: exit {code}\n{err}"
