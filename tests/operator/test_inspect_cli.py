"""`pgferry status`, `relays`, `trace` and `dlq show` against a real relay and receivers."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

import pgferry
from pgferry.receiver import Respond
from tests.helpers import MakeReceiver, RunningRelay, eventually
from tests.operator.conftest import cli


async def test_status_trace_and_dlq_show_explain_a_failing_endpoint(
    pgferry_cmd: list[str],
    db_url: str,
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:
    _, bad_url = await receiver_factory(lambda _: Respond(500, b"receiver says: database is down"))
    good, good_url = await receiver_factory()
    await ferry.subscribe("billing", ["orders"], bad_url, max_attempts=1)
    await ferry.subscribe("audit", ["orders"], good_url)
    await ferry.subscribe("unrelated", ["other"], good_url)
    event_id = await ferry.publish("orders", {"order": 7}, key="customer-1")

    async def settled() -> bool:
        dead = await conn.fetchval("select count(*) from ferry.dead_letters")
        return bool(dead == 1 and len(good.received) == 1)

    await eventually(settled, what="one dead letter and one delivery")

    # trace: the event, each matching subscription with where the event is, every attempt
    traced = await cli(pgferry_cmd, db_url, "trace", str(event_id), "--json")
    assert traced.returncode == 0, traced.stderr
    trace = orjson.loads(traced.stdout)
    assert trace["event"]["payload"] == {"order": 7} and trace["event"]["key"] == "customer-1"
    where = {s["name"]: s["state"] for s in trace["subscriptions"]}
    assert where == {"audit": "delivered", "billing": "dead"}
    attempts = {a["subscription"]: a for a in trace["attempts"]}
    assert attempts["billing"]["status"] == 500 and attempts["billing"]["error_class"] == "http_status"
    assert attempts["billing"]["response"] == "receiver says: database is down"
    assert attempts["audit"]["status"] == 200 and attempts["audit"]["error_class"] is None
    assert attempts["audit"]["latency_ms"] > 0
    table = await cli(pgferry_cmd, db_url, "trace", str(event_id))
    assert "receiver says: database is down" in table.stdout and "delivered" in table.stdout, table.stdout

    missing = await cli(pgferry_cmd, db_url, "trace", "999999")
    assert missing.returncode == 1 and "event 999999 is not in the retained log" in missing.stderr

    # status: health per endpoint, owner; relays: who owns what
    rows: list[dict[str, Any]] = []

    async def reported() -> bool:  # rates come with the relay's next heartbeat
        rows[:] = orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)
        by_name = {r["name"]: r for r in rows}
        return bool(by_name["billing"]["error_rate"] == "100.0%" and by_name["audit"]["owner"])

    await eventually(reported, what="the failure to show in status")
    by_name = {r["name"]: r for r in rows}
    assert by_name["billing"]["health"].startswith("failing: HTTP 500"), by_name["billing"]["health"]
    assert "never succeeded" in by_name["billing"]["health"]
    assert by_name["billing"]["dead"] == 1 and by_name["billing"]["parked"] == 0
    assert by_name["audit"]["health"] == "ok" and by_name["audit"]["lag_events"] == 0
    assert by_name["unrelated"]["health"] == "idle: no events ever written to this stream"
    relays = orjson.loads((await cli(pgferry_cmd, db_url, "relays", "--json")).stdout)
    assert len(relays) == 1 and relays[0]["live"] is True
    assert sorted(relays[0]["owned"]) == ["audit", "billing", "unrelated"]
    assert relays[0]["id"] == by_name["billing"]["owner"]
    text = (await cli(pgferry_cmd, db_url, "status")).stdout
    assert "failing: HTTP 500" in text and "relays" in text and relays[0]["id"] in text

    # dlq show: the whole dead letter with its history
    letters = orjson.loads((await cli(pgferry_cmd, db_url, "dlq", "list", "--json")).stdout)
    shown = await cli(pgferry_cmd, db_url, "dlq", "show", str(letters[0]["id"]), "--json")
    assert shown.returncode == 0, shown.stderr
    letter = orjson.loads(shown.stdout)
    assert letter["event_id"] == event_id and letter["payload"] == {"order": 7}
    assert letter["last_response"] == "receiver says: database is down"
    assert [(a["attempt"], a["status"]) for a in letter["attempt_history"]] == [(1, 500)]
    human = await cli(pgferry_cmd, db_url, "dlq", "show", str(letters[0]["id"]))
    assert "pgferry dlq replay billing --id" in human.stdout
    gone = await cli(pgferry_cmd, db_url, "dlq", "show", "424242")
    assert gone.returncode == 1 and "dead letter 424242 does not exist" in gone.stderr


async def test_status_piped_is_one_line_a_row_and_says_when_no_relay_runs(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    # Found by an outside probe: 1,000 subscriptions printed as 4,921 lines folded to 80 columns,
    # and with no relay every lag read 0 however much was written.
    name = "a-subscription-name-long-enough-to-have-been-folded-" + "x" * 40
    await conn.execute("select ferry.subscribe($1, array['orders'], 'http://127.0.0.1:9/')", name)
    await conn.execute("select ferry.subscribe('other', array['orders'], 'http://127.0.0.1:9/')")
    text = (await cli(pgferry_cmd, db_url, "status")).stdout
    lines = text.splitlines()
    assert lines[0].startswith("no relay is running"), text
    assert [line.split()[0] for line in lines if line.startswith((name, "other "))] == [name, "other"], text
    assert not any(c in text for c in "┃━│─"), "no box drawing in a pipe"


async def test_trace_and_dlq_show_print_control_characters_as_escapes(
    pgferry_cmd: list[str], db_url: str, relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:  # fmt: skip
    """A writer's key and a receiver's answer reached the operator's terminal raw: ESC[2J cleared it
    (outside probe)."""
    _, url = await receiver_factory(lambda _: Respond(500, b"no\x1b]0;owned\x07"))
    await ferry.subscribe("hook", ["s"], url, max_attempts=1)
    event_id = await ferry.publish("s", {"n": 1}, key="k\x1b[2J")

    async def dead() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 1)

    await eventually(dead, what="a dead letter")
    letter = str(await conn.fetchval("select id from ferry.dead_letters"))
    for args in (("trace", str(event_id)), ("dlq", "show", letter)):
        shown = await cli(pgferry_cmd, db_url, *args)
        assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout, shown.stdout
        assert "\\x1b" in shown.stdout, shown.stdout


async def test_trace_says_a_held_event_goes_when_a_probe_gets_an_answer(
    pgferry_cmd: list[str], db_url: str, relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """A held event is due, waiting for its endpoint: trace showed its due time, in the past (outside probe)."""
    await ferry.subscribe("down", ["s"], "http://127.0.0.1:9/", retry_base_ms=10, retry_max_ms=20)
    await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(1, 10) g")

    async def down() -> bool:
        return bool(await conn.fetchval("select count(*) >= 5 from ferry.attempts"))

    await eventually(down, what="five failures: the endpoint down")

    async def held() -> bool:  # what comes after is held
        await ferry.publish("s", {"n": 11})
        return bool(await conn.fetchval("select count(*) from ferry.retries where last_error like 'held:%'"))

    await eventually(held, what="events held behind the down endpoint")

    async def traced() -> bool:  # (a held event may become the next probe meanwhile: take another)
        event_id = await conn.fetchval("select max(event_id) from ferry.retries where last_error like 'held:%'")
        shown = await cli(pgferry_cmd, db_url, "trace", str(event_id))
        assert shown.returncode == 0, shown.stderr
        return "when a probe gets an answer" in shown.stdout

    await eventually(traced, what="trace saying a held event goes when a probe gets an answer")


async def test_a_since_before_year_one_and_an_empty_database_url_are_refused_clearly(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry
) -> None:
    """Outside probe: `replay --since 99999999d` was an OverflowError traceback, and `run` with
    PGFERRY_DATABASE_URL set but empty started a throwaway demo database in the service's place."""
    await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x")
    for since, says in (("99999999d", "reaches back before year 1"), ("9999999999999999999999d", "before year 1"),
                        ("0001-01-01T00:00:00+01:00", "outside years 1-9999 in UTC"),
                        ("9999-12-31T23:59:59-01:00", "outside years 1-9999 in UTC")):  # fmt: skip
        replay = await cli(pgferry_cmd, db_url, "replay", "hook", "--since", since, "--yes")
        assert replay.returncode == 2 and says in replay.stderr, replay.stderr
        assert "Traceback" not in replay.stderr
    for env, args in (({"PGFERRY_DATABASE_URL": ""}, ()), ({}, ("--database-url", " "))):
        run = await cli(pgferry_cmd, db_url, "run", *args, "--exit-after", "1", env=env, timeout=20)
        assert run.returncode == 2 and "is empty: give the database's URL" in run.stderr, (run.stdout, run.stderr)
        assert "throwaway" not in run.stdout


async def test_a_silent_relay_is_listed_delivering_nothing(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    """Outside probe: a relay SIGKILLed half an hour before was listed (for up to an hour) as
    delivering partitions removed since."""
    await conn.execute(
        "insert into ferry.relays (id, hostname, pid, heartbeat_at, owned) "
        "values ('vm:3258:32dbda', 'vm', 3258, now() - interval '29 minutes', '{hot#0/4,hot#1/4}')"
    )
    listed = await cli(pgferry_cmd, db_url, "relays", "--json")
    assert listed.returncode == 0, listed.stderr
    (relay,) = orjson.loads(listed.stdout)
    assert (relay["live"], relay["owned"]) == (False, [])
