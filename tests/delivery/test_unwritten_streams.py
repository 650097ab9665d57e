"""Subscribing to a stream nothing has written yet: accepted, and said so (SQL NOTICE, CLI warning, status).

A stream is known when a captured table writes it, when it is 'net.http' with
the pg_net add-on, or when an event of it was written: the catalog kept by
housekeeping (migration 0008) plus the events committed since it last ran.
"""

from __future__ import annotations

from pathlib import Path

import asyncpg
import orjson

import pgferry
from pgferry.schema import install
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually, tick

URL = "http://127.0.0.1:9/"


async def _subscribe_noting(
    conn: asyncpg.Connection, name: str, streams: list[str]
) -> list[asyncpg.PostgresLogMessage]:
    """ferry.subscribe from SQL; the NOTICEs it raised."""
    heard: list[asyncpg.PostgresLogMessage] = []

    def listen(_: object, message: asyncpg.PostgresLogMessage) -> None:
        heard.append(message)

    conn.add_log_listener(listen)
    try:
        await conn.execute("select ferry.subscribe($1, $2, $3)", name, streams, URL)
        await conn.fetchval("select 1")  # notices arrive before the answer; this flushes their callbacks
    finally:
        conn.remove_log_listener(listen)
    return heard


def _unwritten(message: str) -> str:
    return f"pgferry: no events have been written to stream {message} yet"


async def test_subscribe_notices_each_stream_nothing_has_written_and_saves_the_subscription(
    conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    await conn.execute("create table public.orders (id int primary key)")
    await conn.execute("select ferry.capture_table('public.orders')")  # written by a capture, no event yet
    await ferry.publish("billing", {"n": 1})  # an event, committed since the catalog last looked
    streams = ["public.ordrs", "public.orders", "billing", "public.ordrs", 'we"ird']
    heard = await _subscribe_noting(conn, "hook", streams)

    assert [m.message for m in heard] == [_unwritten('"public.ordrs"'), _unwritten(r'"we\"ird"')]
    for message in heard:
        assert message.severity == "NOTICE" and message.sqlstate == "01PF1"  # class 01: a warning
        assert "Check the spelling" in message.hint and "will deliver once events arrive" in message.hint
    saved = await conn.fetchval("select streams from ferry.subscriptions where name = 'hook'")
    assert saved == ["public.ordrs", "public.orders", "billing", 'we"ird']  # a stream listed twice is kept once
    assert await conn.fetchval("select count(*) from ferry.consumers where name = 'webhook:hook'") == 1
    assert await ferry.subscribe("hook", ["billing", "public.orders", "nope"], URL) == ["nope"]
    # An uncaptured table's stream no longer counts (unless it has events).
    await conn.execute("select ferry.uncapture_table('public.orders')")
    assert [m.message for m in await _subscribe_noting(conn, "hook", ["public.orders"])] == [
        _unwritten('"public.orders"')
    ]


async def test_net_http_is_known_once_the_pg_net_api_is_installed(conn: asyncpg.Connection) -> None:
    assert [m.message for m in await _subscribe_noting(conn, "calls", ["net.http"])] == [_unwritten('"net.http"')]
    await install(conn, addons=["pg_net"])
    assert await _subscribe_noting(conn, "calls", ["net.http"]) == []


async def test_the_catalog_keeps_streams_retention_dropped_and_sees_late_commits(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.publish("old", {"n": 1})
    # A transaction in progress while housekeeping catalogues, committing after it.
    late = await asyncpg.connect(db_url)
    try:
        tx = late.transaction()
        await tx.start()
        await late.execute("select ferry.publish('late', '{}')")
        await tick(conn)  # the catalog goes up to the newest tick
        await conn.fetchval("select ferry.housekeeping()")  # catalogues 'old'; 'late' is not committed yet
        await tx.commit()
    finally:
        await late.close()
    assert await conn.fetchval("select array_agg(stream order by stream) from ferry.streams") == ["old"]
    assert await ferry.subscribe("s1", ["late", "old"], URL) == []  # 'late': found among the newer commits
    await tick(conn)
    await conn.fetchval("select ferry.housekeeping()")
    assert await conn.fetchval("select array_agg(stream order by stream) from ferry.streams") == ["late", "old"]

    # Rotation truncates their partition (no consumer holds it back): the log forgets, the catalog does not.
    await ferry.unsubscribe("s1")
    done: list[str] = []
    while "retention: partition 0 truncated" not in done and len(done) < 20:
        await tick(conn)
        done += await conn.fetchval("select ferry.housekeeping()")
    assert await conn.fetchval("select count(*) from ferry.events where stream in ('old', 'late')") == 0, done
    assert await _subscribe_noting(conn, "s2", ["old", "late"]) == []


async def test_an_unwritten_stream_delivers_once_events_arrive(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    assert await ferry.subscribe("hook", ["starts.later"], url) == ["starts.later"]
    await ferry.publish("starts.later", {"first": True})

    async def delivered() -> bool:
        return len(receiver.received) == 1

    await eventually(delivered, what="the first event of the new stream")
    assert orjson.loads(receiver.received[0].body) == {"first": True}

    async def catalogued() -> bool:  # the relay's housekeeping adds it to the catalog
        return bool(await conn.fetchval("select count(*) from ferry.streams where stream = 'starts.later'"))

    await eventually(catalogued, what="housekeeping to catalogue the stream")
    assert await ferry.subscribe("hook", ["starts.later"], url) == []


async def test_cli_warns_about_unwritten_streams_and_status_says_so(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, tmp_path: Path
) -> None:
    await conn.execute("create table public.orders (id int primary key)")
    await conn.execute("select ferry.capture_table('public.orders')")

    typo = await cli(pgferry_cmd, db_url, "subscription", "add", "typo", "--url", URL, "--stream", "public.ordrs")
    assert typo.returncode == 0, typo.stderr
    assert "subscription typo -> http://127.0.0.1:9/ saved" in typo.stdout
    warning = typo.stderr.strip()
    assert warning.startswith('warning: no events have been written to stream "public.ordrs" yet; check the spelling')
    assert "\n" not in warning
    fine = await cli(pgferry_cmd, db_url, "subscription", "add", "fine", "--url", URL, "--stream", "public.orders")
    assert fine.returncode == 0 and fine.stderr == "", fine.stderr
    mixed = await cli(pgferry_cmd, db_url, "subscription", "add", "mixed", "--url", URL,
                      "--stream", "public.orders", "--stream", "a", "--stream", "b")  # fmt: skip
    assert mixed.returncode == 0 and mixed.stderr.count("warning: ") == 2, mixed.stderr

    path = tmp_path / "pgferry.toml"
    path.write_text(f'[subscriptions.filed]\nstreams = ["public.orders", "biling"]\nurl = "{URL}"\n')
    for dry_run in (["--dry-run"], []):
        applied = await cli(pgferry_cmd, db_url, "apply", str(path), *dry_run)
        assert applied.returncode == 0, applied.stderr
        assert applied.stderr.startswith('warning: filed: no events have been written to stream "biling" yet')
    plan = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--json")).stdout)
    assert [c["unwritten_streams"] for c in plan["changes"] if c["name"] == "filed"] == [["biling"]]

    status = {r["name"]: r for r in orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)}
    assert status["typo"]["health"] == "idle: no events ever written to this stream"
    assert status["typo"]["unknown_streams"] == ["public.ordrs"]
    assert status["mixed"]["health"] == "idle: no events ever written to streams a, b"
    assert status["filed"]["health"] == "idle: no events ever written to stream biling"
    assert status["fine"]["health"] == "idle" and status["fine"]["unknown_streams"] == []
    await ferry.pause("typo")
    status = {r["name"]: r for r in orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)}
    assert status["typo"]["health"] == "paused: no events ever written to this stream"
    table = await cli(pgferry_cmd, db_url, "status")
    assert "no events ever written to this stream" in table.stdout, table.stdout

    await ferry.publish("public.ordrs", {"n": 1})  # written now: status stops saying so
    status = {r["name"]: r for r in orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)}
    assert status["typo"]["health"] == "paused" and status["typo"]["unknown_streams"] == []
