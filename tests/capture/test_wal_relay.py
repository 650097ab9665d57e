"""WAL capture in `pgferry run`: the relay holding the WAL capture lock decodes the slot, and a
standby takes over when it is SIGKILLed mid-decode; every committed row is in the log once."""

from __future__ import annotations

import asyncio
import time

import asyncpg

import pgferry
from pgferry import db
from tests.helpers import eventually
from tests.relay.test_relay import RelayProcess


async def wal_capture_holder(conn: asyncpg.Connection) -> int | None:
    """The backend pid holding the WAL capture lock (relay/leader.py WAL_CAPTURE_LOCK), if any."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "select pid from pg_locks where locktype = 'advisory' and classid = 28774 and objid = 5 and granted"
    )


async def test_a_standby_relay_takes_over_wal_capture_after_sigkill_and_the_log_has_each_row_once(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key, v text)")
    await ferry.capture_table("t", method="wal")
    stop_writing = asyncio.Event()
    written: list[int] = []

    async def write() -> None:
        writer = await db.connect(db_url)
        try:
            n = 0
            while not stop_writing.is_set():
                await writer.execute("insert into t select g, 'v' from generate_series($1::int, $1::int + 199) g", n)
                written.extend(range(n, n + 200))
                n += 200
                await asyncio.sleep(0.005)
        finally:
            await writer.close()

    async def in_log() -> list[int]:
        rows = await conn.fetch("select (payload->>'id')::int as id from ferry.events where stream = 'public.t'")
        return [r["id"] for r in rows]

    def decoding(before: int):  # type: ignore[no-untyped-def]
        async def check() -> bool:
            return len(await in_log()) > before + 2000

        return check

    relays = [RelayProcess(pgferry_cmd, db_url)]
    writer = asyncio.create_task(write())
    try:
        for _ in range(3):
            holder = relays[-1]

            async def leading() -> bool:
                return await wal_capture_holder(conn) is not None

            await eventually(leading, what="a relay holding the WAL capture lock")
            relays.append(RelayProcess(pgferry_cmd, db_url))  # the standby
            await eventually(decoding(len(await in_log())), what="the leader decoding")
            holder.proc.kill()  # mid-decode: the writer never stops
            killed_at = time.monotonic()
            await eventually(decoding(len(await in_log())), what="the standby decoding")
            assert time.monotonic() - killed_at < 15
        stop_writing.set()
        await writer

        async def complete() -> bool:
            return len(await in_log()) >= len(written)

        await eventually(complete, timeout=30, what="every written row in the log")
        ids = await in_log()
        assert len(ids) == len(set(ids)), "a row is in the log twice"
        assert sorted(ids) == written
    finally:
        stop_writing.set()
        await writer
        for relay in relays:
            relay.stop()
