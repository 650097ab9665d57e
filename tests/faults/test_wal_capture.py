"""WAL capture under the faults of its own: PostgreSQL restarted (fast and crash) mid-decode, a
million-row transaction, and a slot PostgreSQL invalidates (max_slot_wal_keep_size).

The truth is the captured table itself: at the end, the ids in the log are exactly the rows the
table holds (a crash may swallow the acknowledgement of a commit that happened), each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator

import asyncpg

from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.schema import install
from tests.helpers import RunningRelay, eventually


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


async def test_a_slot_invalidated_by_max_slot_wal_keep_size_is_reported_and_reset() -> None:
    async with server(max_slot_wal_keep_size="1MB") as pg:
        await captured(pg.url)
        conn = await db.connect(pg.url)
        try:
            # No relay runs: the slot holds WAL back until PostgreSQL gives up on it.
            await conn.execute("insert into t values (1, 'lost')")
            await conn.execute("create table filler (pad text)")
            for _ in range(4):
                await conn.execute("insert into filler select repeat('w', 1000) from generate_series(1, 20000)")
                await conn.execute("select pg_switch_wal()")
                await conn.execute("checkpoint")
            assert await conn.fetchval("select wal_status from pg_replication_slots") == "lost"

            relay = RunningRelay(pg.url)
            try:

                async def noted() -> bool:
                    return bool(await conn.fetchval("select invalidated_at is not null from ferry.wal_slot"))

                await eventually(noted, what="the invalidated slot noted")
                note = await conn.fetchval("select note from ferry.wal_slot")
                assert "invalidated" in note and "reset_wal_slot" in note and "backfill" in note
                await conn.fetchval("select ferry.reset_wal_slot()")
                await conn.execute("insert into t values (2, 'after')")

                async def after_reset() -> bool:
                    return bool(await conn.fetchval("select count(*) from ferry.events where stream = 'public.t'") == 1)

                await eventually(after_reset, what="capture going on after the reset")
                assert (
                    await conn.fetchval("select payload->>'pad' from ferry.events where stream = 'public.t'") == "after"
                )
            finally:
                await relay.stop()
        finally:
            await conn.close()
