"""The operator's commands for webhooks, run as real subprocesses."""

from __future__ import annotations

import asyncio
import subprocess
import time

import asyncpg
import orjson
import pytest
from click.testing import CliRunner

import pgferry
from pgferry.params import Origin
from pgferry.receiver import Respond
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually


async def test_subscription_lifecycle_from_the_cli(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    secret = (await cli(pgferry_cmd, db_url, "subscription", "secret")).stdout.strip()
    assert secret.startswith("whsec_")
    added = await cli(
        pgferry_cmd, db_url, "subscription", "add", "hook", "--url", "http://127.0.0.1:9/x",
        "--stream", "a", "--stream", "b", "--batch-size", "5", "--ordered", "--secret", secret,
        "--header", "X-Team=payments",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = orjson.loads((await cli(pgferry_cmd, db_url, "subscription", "list", "--json")).stdout)
    assert listed[0]["name"] == "hook" and listed[0]["streams"] == ["a", "b"] and listed[0]["batch_size"] == 5
    assert listed[0]["ordered"] is True and listed[0]["secrets"] == 1
    assert secret not in (await cli(pgferry_cmd, db_url, "subscription", "list")).stdout

    assert (await cli(pgferry_cmd, db_url, "subscription", "pause", "hook")).returncode == 0
    assert await conn.fetchval("select state from ferry.subscriptions") == "paused"
    assert (await cli(pgferry_cmd, db_url, "subscription", "resume", "hook")).returncode == 0
    assert await conn.fetchval("select state from ferry.subscriptions") == "active"
    assert (await cli(pgferry_cmd, db_url, "subscription", "remove", "hook")).returncode == 0
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0
    assert await conn.fetchval("select count(*) from ferry.consumers") == 0


async def test_subscription_add_on_an_existing_one_changes_only_what_it_is_given(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    """`subscription add NAME ... --partitions 4`, the docs' way to add partitions, turned ordering
    off and dropped the subscription's headers, filter and attempts without a word (outside probe)."""
    await conn.execute(
        """select ferry.subscribe('hook', array['s'], 'http://127.0.0.1:9/x', ordered => true, batch_size => 50,
                                  headers => '{"Authorization": "Bearer t"}', filter => '$.a > 1', max_attempts => 3,
                                  connect_timeout_ms => 700)"""
    )
    settings = ("select ordered, batch_size, headers, filter, max_attempts, connect_timeout_ms, partitions "
                "from ferry.subscriptions")  # fmt: skip
    before = dict(await conn.fetchrow(settings))
    added = await cli(pgferry_cmd, db_url, "subscription", "add", "hook", "--url", "http://127.0.0.1:9/x",
                      "--stream", "s", "--partitions", "4")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert dict(await conn.fetchrow(settings)) == {**before, "partitions": 4}
    added = await cli(pgferry_cmd, db_url, "subscription", "add", "hook", "--url", "http://127.0.0.1:9/x",
                      "--stream", "s", "--filter", "", "--max-attempts", "5")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert dict(await conn.fetchrow(settings)) == {**before, "partitions": 4, "filter": None, "max_attempts": 5}


async def test_subscription_add_turns_ordering_off_and_clears_headers_of_an_existing_one(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    """Settings not given are kept, so nothing could switch ordering off (--no-ordered: "No such
    option") or remove the headers (--header '': "'' is not NAME=VALUE"; outside verifier)."""
    add = ("subscription", "add", "hook", "--url", "http://127.0.0.1:9/x", "--stream", "s")
    settings = "select ordered, headers, batch_size from ferry.subscriptions"
    made = await cli(pgferry_cmd, db_url, *add, "--ordered", "--header", "X-A=1", "--header", "X-B=2",
                     "--batch-size", "5")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert tuple(await conn.fetchrow(settings)) == (True, {"X-A": "1", "X-B": "2"}, 5)
    off = await cli(pgferry_cmd, db_url, *add, "--no-ordered")
    assert off.returncode == 0, off.stderr
    assert tuple(await conn.fetchrow(settings)) == (False, {"X-A": "1", "X-B": "2"}, 5)
    cleared = await cli(pgferry_cmd, db_url, *add, "--clear-headers")
    assert cleared.returncode == 0, cleared.stderr
    assert tuple(await conn.fetchrow(settings)) == (False, {}, 5)
    on = await cli(pgferry_cmd, db_url, *add, "--ordered")
    assert on.returncode == 0, on.stderr
    assert tuple(await conn.fetchrow(settings)) == (True, {}, 5)
    both = await cli(pgferry_cmd, db_url, *add, "--clear-headers", "--header", "X-A=1")
    assert both.returncode == 2 and "--clear-headers and --header" in both.stderr, both.stderr
    empty = await cli(pgferry_cmd, db_url, *add, "--header", "")
    assert empty.returncode == 2 and "--clear-headers removes every header" in empty.stderr, empty.stderr
    assert tuple(await conn.fetchrow(settings)) == (True, {}, 5)
    shown = await cli(pgferry_cmd, db_url, "subscription", "add", "--help")
    assert "--ordered / --no-ordered" in shown.stdout and "--clear-headers" in shown.stdout


async def test_resume_says_what_it_did_of_a_subscription_that_was_not_stalled(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    """`resume --from retained` of an active subscription said "resumed from the oldest retained
    event", though nothing moved: only a stalled one reads from there (outside verifier)."""
    await conn.execute("select ferry.subscribe('hook', array['s'], 'http://127.0.0.1:9/x')")
    resume = ("subscription", "resume", "hook")
    active = await cli(pgferry_cmd, db_url, *resume, "--from", "retained")
    assert active.returncode == 0, active.stderr
    assert active.stdout == ("subscription hook was active and not stalled: nothing changed (--from retained moves "
                             "only a stalled subscription's cursor)\n")  # fmt: skip
    assert (await cli(pgferry_cmd, db_url, *resume)).stdout == "subscription hook was active already: nothing changed\n"
    await conn.execute("select ferry.pause_subscription('hook')")
    paused = await cli(pgferry_cmd, db_url, *resume, "--from", "retained")
    assert paused.stdout == ("subscription hook resumed from where it was paused (it was not stalled: --from "
                             "retained moved nothing)\n")  # fmt: skip
    assert await conn.fetchval("select state from ferry.subscriptions") == "active"
    now = await cli(pgferry_cmd, db_url, *resume, "--from", "now")
    assert now.stdout.startswith("subscription hook was active; it reads on from now: events it had not read were "
                                 "skipped")  # fmt: skip


async def test_cli_errors_are_clear(pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection) -> None:
    bad = await cli(pgferry_cmd, db_url, "subscription", "add", "x", "--url", "gopher://h.invalid/", "--stream", "s")
    assert bad.returncode == 1 and "unsupported URL scheme 'gopher'" in bad.stderr
    # One line, its hint as a sentence of its own; no warning about resolving a host it refused anyway.
    assert bad.stderr.strip().splitlines() == [
        "Error: pgferry: unsupported URL scheme 'gopher'. Webhooks use http:// or https://, NATS JetStream "
        "nats://host:4222/<subject>, Redis Streams redis://host:6379/<db>?stream=<name>."
    ]
    unresolvable = await cli(pgferry_cmd, db_url, "subscription", "add", "x", "--url", "http://h.invalid/",
                             "--stream", "s")  # fmt: skip
    assert unresolvable.returncode == 0 and "subscription x -> http://h.invalid/ saved" in unresolvable.stdout
    assert "warning: cannot resolve 'h.invalid' from here" in unresolvable.stderr
    missing = await cli(pgferry_cmd, db_url, "subscription", "pause", "nope")
    assert missing.returncode == 1 and "subscription 'nope' does not exist" in missing.stderr
    # Commands that found nothing to act on said "removed" or "0 dead letter(s)", exit 0, of a typo.
    unknown = [("subscription", "remove", "nope"), ("dlq", "replay", "nope"), ("dlq", "discard", "nope"),
               ("dlq", "list", "--subscription", "nope")]  # fmt: skip
    for done in await asyncio.gather(*(cli(pgferry_cmd, db_url, *args) for args in unknown)):
        assert (done.returncode, done.stdout, done.stderr) == (
            1, "", "Error: pgferry: subscription 'nope' does not exist; see `pgferry subscription list`\n"
        ), done.args  # fmt: skip
    header = await cli(pgferry_cmd, db_url, "subscription", "add", "x", "--url", "http://h/", "--stream", "s",
                       "--header", "novalue")  # fmt: skip
    assert header.returncode == 2 and "NAME=VALUE" in header.stderr
    # Each refusal names the option it is about (PostgreSQL's own words did not).
    interval = "invalid input syntax for type interval: \"soon\"; give a PostgreSQL interval such as '3 days'"
    for command, option, value, code, says in [
        (("subscription", "add", "x", "--url", "http://h/", "--stream", "s"), "--timeout-ms", "99999999999999", 2,
         "Invalid value for '--timeout-ms': 99999999999999 is not in the range 0<=x<=2147483647"),
        (("subscription", "add", "x", "--url", "http://h/", "--stream", "s"), "--batch-size", "99999999999", 2,
         "Invalid value for '--batch-size': 99999999999 is not in the range"),
        (("subscription", "add", "x", "--url", "http://h/", "--stream", "s"), "--max-age", "soon", 1,
         f"Error: invalid value for --max-age: {interval}"),
        (("retention", "set"), "--max-age", "soon", 1, f"Error: invalid value for --max-age: {interval}"),
        (("subscription", "add", "x", "--url", "http://h/", "--stream", "s"), "--max-age", "999999999 years", 1,
         "Error: invalid value for --max-age: interval out of range"),
        (("capture", "nosch.items"), "--stream", "s", 1, 'Error: schema "nosch" does not exist'),  # a traceback
        (("dlq", "replay", "x"), "--id", "99999", 1,  # "0 dead letter(s) queued", exit 0
         "Error: 0 of the 1 dead letter(s) asked for queued: the others are not dead letters of 'x'"),
        (("dlq", "discard", "x"), "--id", "99999", 1,  # "0 dead letter(s) discarded", exit 0
         "Error: 0 of the 1 dead letter(s) asked for discarded: the others are not dead letters of 'x'"),
    ]:  # fmt: skip
        result = await cli(pgferry_cmd, db_url, *command, option, value)
        assert result.returncode == code and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    await conn.execute("create table items (id int primary key)")
    twice = await cli(pgferry_cmd, db_url, "capture", "items", "--key-column", "id", "--key-column", "id")
    assert twice.returncode == 1 and "key_columns names id more than once" in twice.stderr, twice.stderr


async def test_dlq_and_status_from_the_cli(
    pgferry_cmd: list[str],
    db_url: str,
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:
    healthy = False
    receiver, url = await receiver_factory(lambda _: Respond() if healthy else Respond(500, b"nope"))
    await ferry.subscribe("hook", ["s"], url, max_attempts=1)
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(3)])

    async def dead() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 3)

    await eventually(dead, what="three dead letters")
    status: list[dict[str, object]] = []

    async def reported() -> bool:  # rates come with the relay's next heartbeat
        status[:] = orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)
        return status[0]["error_rate"] == "100.0%"

    await eventually(reported, what="the failures to show in status")
    assert status[0]["name"] == "hook" and status[0]["dead"] == 3 and status[0]["owner"] is not None
    table = await cli(pgferry_cmd, db_url, "status")
    assert "hook" in table.stdout and "100.0%" in table.stdout

    letters = orjson.loads((await cli(pgferry_cmd, db_url, "dlq", "list", "--json")).stdout)
    assert sorted(letter["event_id"] for letter in letters) == ids
    assert letters[0]["last_error"] == "HTTP 500 Internal Server Error" and letters[0]["last_response"] == "nope"

    discarded = await cli(pgferry_cmd, db_url, "dlq", "discard", "hook", "--id", str(letters[0]["id"]))
    assert "1 dead letter(s) discarded" in discarded.stdout
    healthy = True
    replayed = await cli(pgferry_cmd, db_url, "dlq", "replay", "hook")
    assert "2 dead letter(s) queued" in replayed.stdout

    async def delivered() -> bool:
        return len(receiver.received) == 2

    await eventually(delivered, what="replayed deliveries")


async def test_a_long_json_answer_reaches_a_slow_reader_of_a_pipe_whole(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    """After uvloop had run, a write to a pipe returned at its 64 KiB and the rest was lost:
    `pgferry subscription list --json | slow-reader` got 65,536 bytes, exit 0 (outside probe)."""
    await conn.execute(
        "select ferry.subscribe('s' || g, array['x'], 'http://127.0.0.1:9/' || repeat('p', 200)) "
        "from generate_series(1, 400) g"
    )

    def run() -> tuple[bytes, int]:
        proc = subprocess.Popen([*pgferry_cmd, "subscription", "list", "--json", "--database-url", db_url],
                                stdout=subprocess.PIPE)  # fmt: skip
        time.sleep(3)  # the command has written what fits in the pipe by now
        out, _ = proc.communicate(timeout=60)
        return out, proc.returncode

    out, status = await asyncio.to_thread(run)
    assert status == 0 and len(out) > 1 << 17
    assert len(orjson.loads(out)) == 400


#: Numbers no command can use, each with what click says of it: nan compares false with every
#: bound (click.FloatRange let it through), a port past 65535 wrapped, zero intervals spun.
_REFUSED_NUMBERS = [
    (("run", "--tick-interval", "nan"), "'nan' is not a finite number"),
    (("run", "--tick-interval", "0"), "0.0 is not in the range x>0"),
    (("run", "--idle-poll-interval", "-1"), "-1.0 is not in the range x>0"),
    (("run", "--exit-after", "nan"), "'nan' is not a finite number"),
    (("run", "--db-command-timeout", "inf"), "'inf' is not a finite number"),
    (("run", "--metrics-port", "70000"), "70000 is not in the range 0<=x<=65535"),
    (("run", "--dashboard-port", "-1"), "-1 is not in the range 0<=x<=65535"),
    (("run", "--api-port", "65536"), "65536 is not in the range 0<=x<=65535"),
    (("tail", "--count", "0"), "0 is not in the range x>=1"),
    (("tail", "--timeout", "-1"), "-1.0 is not in the range x>0"),
    (("tail", "--timeout", "nan"), "'nan' is not a finite number"),
    (("backfill", "t", "--max-rate", "nan"), "'nan' is not a finite number"),
    (("dlq", "list", "--limit", "0"), "0 is not in the range x>=1"),
    (("replay", "x", "--since", "1h", "--chunk", "0"), "0 is not in the range 1<=x<=1000000"),
    (("run", "--api-cors-origin", "not a url"), "'not a url' is not an origin"),
    (("run", "--api-cors-origin", "https://app.example.com/"), "is not an origin"),  # a path: never matches
]


def test_an_origin_is_taken_in_the_form_browsers_send() -> None:
    kind = Origin()
    assert kind.convert("https://App.Example.com:8443", None, None) == "https://app.example.com:8443"
    assert kind.convert("chrome-extension://abcdef", None, None) == "chrome-extension://abcdef"
    assert kind.convert("*", None, None) == "*"


@pytest.mark.parametrize(("args", "says"), _REFUSED_NUMBERS, ids=lambda a: " ".join(a) if isinstance(a, tuple) else "")
def test_numbers_no_command_can_use_are_refused_before_connecting(
    args: tuple[str, ...], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgferry.cli import common, main

    # In this process: the command's logging setup (root handler, asyncpg.pool filter) must not stay.
    monkeypatch.setattr(common, "configure", lambda **_: None)

    # Nothing listens there: a value let through would fail to connect (exit 1), not be refused (2).
    done = CliRunner().invoke(main, [*args, "--database-url", "postgresql://postgres@127.0.0.1:1/x"])
    assert done.exit_code == 2 and says in done.output, done.output
