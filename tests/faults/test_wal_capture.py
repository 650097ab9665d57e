"""WAL capture under the faults of its own: PostgreSQL restarted (fast and crash) mid-decode, a
million-row transaction, and a slot PostgreSQL invalidates (max_slot_wal_keep_size), which is a
recorded gap of every consumer reading what WAL capture writes.

The truth is the captured table itself: at the end, the ids in the log are exactly the rows the
table holds (a crash may swallow the acknowledgement of a commit that happened), each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg

from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.schema import install
from tests.helpers import FAST, RunningRelay, cli, eventually


@contextlib.asynccontextmanager
async def server(**settings: str) -> AsyncIterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(settings={"fsync": "on", **settings})  # a crash must not lose acknowledged commits
    pg.start()
    try:
        yield pg
    finally:
        pg.destroy()


async def captured(url: str) -> None:
    conn = await db.connect(url)
    try:
        await install(conn)
        await conn.execute("create table t (id bigint primary key, pad text)")
        await conn.execute("select ferry.capture_table('t', method => 'wal')")
    finally:
        await conn.close()


async def log_matches_table(url: str, timeout: float) -> int:
    """Wait until the log holds every row of t; fail on a duplicate or an id t does not hold."""
    conn = await db.connect(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = set(await conn.fetchval("select coalesce(array_agg(id), '{}') from t"))
            ids = await conn.fetchval(
                "select coalesce(array_agg((payload->>'id')::bigint), '{}') from ferry.events where stream = 'public.t'"
            )
            assert len(ids) == len(set(ids)), "a row is in the log twice"
            assert set(ids) <= rows, f"in the log, not in the table: {sorted(set(ids) - rows)[:5]}"
            if set(ids) == rows:
                return len(rows)
            assert time.monotonic() < deadline, f"{len(rows) - len(set(ids))} row(s) of t missing from the log"
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def test_postgres_restarted_fast_and_crashed_mid_decode_leaves_each_row_once() -> None:
    async with server() as pg:
        await captured(pg.url)
        relay = RunningRelay(pg.url)
        stop = asyncio.Event()

        async def write() -> None:
            n = 0
            conn: asyncpg.Connection | None = None
            while not stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await db.connect(pg.url)
                    await conn.execute("insert into t select g, 'x' from generate_series($1::bigint, $1 + 499) g", n)
                except (*db.CONNECTION_ERRORS, asyncpg.PostgresError, OSError):
                    # The server is restarting; this batch may or may not have committed.
                    if conn is not None:
                        conn.terminate()
                        conn = None
                    await asyncio.sleep(0.2)
                n += 500
                await asyncio.sleep(0.01)
            if conn is not None:
                await conn.close()

        writer = asyncio.create_task(write())
        try:
            for mode in ("fast", "immediate", "immediate"):
                await asyncio.sleep(1.5)  # the relay decoding a steady stream
                await asyncio.to_thread(pg.restart, mode)
            await asyncio.sleep(1.5)
        finally:
            stop.set()
            await writer
        try:
            rows = await log_matches_table(pg.url, timeout=60)
        finally:
            await relay.stop()
        assert rows > 2000


async def test_a_million_row_transaction_arrives_whole_in_bounded_memory() -> None:
    async with server(fsync="off") as pg:
        await captured(pg.url)
        relay = RunningRelay(pg.url)
        try:
            conn = await db.connect(pg.url)
            await conn.execute("insert into t select g, null from generate_series(1, 1000000) g")
            await conn.close()
            peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB
            started = time.monotonic()
            assert await log_matches_table(pg.url, timeout=240) == 1_000_000
            seconds = time.monotonic() - started
            grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
        finally:
            await relay.stop()
        print(
            f"1,000,000-row transaction in the log {seconds:.1f} s after its commit; peak memory grew {grown_mb:.0f} MB"
        )
        assert grown_mb < 300  # chunks of 5,000, not the transaction at once


async def test_a_slot_invalidated_by_max_slot_wal_keep_size_is_refused_reported_as_a_gap_of_its_readers_and_reset(
    pgferry_cmd: list[str],
) -> None:
    async with server(max_slot_wal_keep_size="1MB") as pg:
        await captured(pg.url)
        conn = await db.connect(pg.url)
        try:
            await conn.execute("create table u (id int primary key)")
            await conn.execute("select ferry.capture_table('u', stream => 'by_trigger')")
            for name, streams in (("reader", ["public.t"]), ("everything", None), ("elsewhere", ["by_trigger"])):
                await conn.execute("select ferry.register_consumer($1, $2)", name, streams)
            await conn.execute(
                "select ferry.subscribe('hook', array['public.t'], 'http://127.0.0.1:9/', partitions => 2)"
            )
            readers = {"reader", "everything"} | {
                r["name"] for r in await conn.fetch("select name from ferry.consumers where subscription = 'hook'")
            }
            complete_up_to = await conn.fetchval("select lsn::text from ferry.wal_slot")
            # No relay runs: the slot holds WAL back until PostgreSQL gives up on it.
            await conn.execute("insert into t values (1, 'lost')")
            await conn.execute("create table filler (pad text)")
            for _ in range(4):
                await conn.execute("insert into filler select repeat('w', 1000) from generate_series(1, 20000)")
                await conn.execute("select pg_switch_wal()")
                await conn.execute("checkpoint")
            assert await conn.fetchval("select wal_status from pg_replication_slots") == "lost"
            # The lost slot is not taken for a live one: capturing another table says what to do.
            refused = await cli(pgferry_cmd, pg.url, "capture", "u", "--method", "wal")
            assert refused.returncode != 0 and "invalidated" in refused.stderr, refused.stderr
            assert "ferry.reset_wal_slot()" in refused.stderr and "Traceback" not in refused.stderr

            relay = RunningRelay(pg.url, replace(FAST, deliver=False))
            try:

                async def noted() -> bool:
                    return bool(await conn.fetchval("select invalidated_at is not null from ferry.wal_slot"))

                await eventually(noted, what="the invalidated slot noted")
                note = await conn.fetchval("select note from ferry.wal_slot")
                assert "invalidated" in note and "reset_wal_slot" in note and "backfill" in note
                # A gap of each consumer reading a WAL-captured stream, every partition of the
                # subscription, open (to_lsn NULL) from where the log was complete; the subscription
                # is not stalled (its cursor skipped nothing).
                gaps = await conn.fetch("select consumer, subscription, from_lsn::text, to_lsn, events, cause, reason "
                                        "from ferry.gaps order by consumer")  # fmt: skip
                assert {g["consumer"] for g in gaps} == readers
                assert {(g["from_lsn"], g["to_lsn"], g["events"], g["cause"]) for g in gaps} == {
                    (complete_up_to, None, None, "wal slot lost")
                }
                assert {g["subscription"] for g in gaps if g["consumer"].startswith("webhook:")} == {"hook"}
                assert "reset_wal_slot" in gaps[0]["reason"]
                assert await conn.fetchval("select state from ferry.subscriptions") == "active"
                status = await cli(pgferry_cmd, pg.url, "status")
                for reader in readers:
                    assert any(
                        line.startswith(reader) and "changes from the WAL (1 gap(s))" in line
                        for line in status.stdout.splitlines()
                    ), status.stdout
                assert "elsewhere" not in status.stdout

                new_slot = await conn.fetchval("select ferry.reset_wal_slot()::text")
                await conn.execute("insert into t values (2, 'after')")

                async def after_reset() -> bool:
                    return bool(await conn.fetchval("select count(*) from ferry.events where stream = 'public.t'") == 1)

                await eventually(after_reset, what="capture going on after the reset")
                assert (
                    await conn.fetchval("select payload->>'pad' from ferry.events where stream = 'public.t'") == "after"
                )
                # The reset closed each gap at the new slot; they stay as history, and readers read on.
                closed = await conn.fetch("select consumer, from_lsn::text, to_lsn::text, newest_event_at, reason "
                                          "from ferry.gaps order by consumer")  # fmt: skip
                assert {g["consumer"] for g in closed} == readers
                assert {(g["from_lsn"], g["to_lsn"]) for g in closed} == {(complete_up_to, new_slot)}
                assert all(g["newest_event_at"] is not None and "reset at" in g["reason"] for g in closed)
                await conn.execute("select ferry.tick(true)")
                assert await conn.fetchval("select count(*) from ferry.next_batch('reader')") == 1
                shown = await cli(pgferry_cmd, pg.url, "retention", "show")
                assert "from LSN" in shown.stdout and new_slot in shown.stdout, shown.stdout
            finally:
                await relay.stop()
        finally:
            await conn.close()
