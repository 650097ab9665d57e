"""A backfill is online: it holds no snapshot between its chunks, so the horizon that vacuum and
pgferry's retention wait for moves on under it, and it takes no table lock that stops a writer of
a row outside the chunk being read."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pgferry.capture import backfill as backfills

ROWS = 400
CHUNK = 100


@dataclass(frozen=True)
class Sample:
    """The runner's session as pg_stat_activity showed it at one moment."""

    #: time.time() (the server runs on this machine: its clock is this one)
    at: float
    state: str
    xmin: int | None
    xact_start: datetime | None


async def _sample(conn: asyncpg.Connection, pid: int) -> Sample:
    row = await conn.fetchrow(
        "select state, backend_xmin::text::bigint as xmin, xact_start from pg_stat_activity where pid = $1", pid
    )
    assert row is not None
    return Sample(time.time(), row["state"], row["xmin"], row["xact_start"])


async def test_a_backfill_holds_no_snapshot_between_chunks_and_never_blocks_a_writer_of_another_row(
    conn: asyncpg.Connection, db_url: str
) -> None:
    """Each chunk reads its rows slowly (a condition that sleeps 1.5 ms a row, about 0.3 s a chunk)
    and the runner is paced to pause between chunks. Watching the runner's session from outside:
    between chunks it is idle with no snapshot (backend_xmin null), each chunk is its own transaction
    whose xmin is newer than the last one's, and an UPDATE of the table's last row, made while a chunk
    is being read, commits before that chunk's transaction ends. The chunk holds only the table locks
    a SELECT ... FOR SHARE takes, which no writer waits for."""
    await conn.execute("create table t (id int primary key, v int not null default 0)")
    await conn.execute(f"insert into t (id) select generate_series(1, {ROWS})")
    await conn.execute("select ferry.capture_table('t')")
    await conn.execute(
        "create function slowly(int) returns boolean language plpgsql "
        "as $$ begin perform pg_sleep(0.0015); return true; end $$"
    )
    backfill = await backfills.start(conn, "public.t", condition="slowly(id)", chunk_size=CHUNK)
    runner_conn = await asyncpg.connect(db_url)
    writer = await asyncpg.connect(db_url)
    try:
        pid = runner_conn.get_server_pid()
        settings = backfills.BackfillSettings(backfill, max_rate=200)  # ~0.5 s a chunk: it pauses ~0.2 s
        running = asyncio.create_task(backfills.BackfillRunner(runner_conn, settings).run(asyncio.Event()))
        samples: list[Sample] = []
        table_locks: set[str] = set()
        writes_in_a_chunk: list[float] = []
        while not running.done():
            s = await _sample(conn, pid)
            samples.append(s)
            if s.state == "active" and s.xact_start is not None:
                held = {
                    r["mode"]
                    for r in await conn.fetch(
                        "select mode from pg_locks where pid = $1 and relation = 't'::regclass", pid
                    )
                }
                table_locks |= held
                if held and len(writes_in_a_chunk) < 2:  # the chunk is reading the table now
                    began = time.monotonic()
                    await asyncio.wait_for(writer.execute(f"update t set v = v + 1 where id = {ROWS}"), 10)
                    took = time.monotonic() - began
                    after = await _sample(conn, pid)
                    if after.state == "active" and after.xact_start == s.xact_start:  # the same chunk, still going
                        writes_in_a_chunk.append(took)
            await asyncio.sleep(0.01)
        assert await running == "done"
    finally:
        await runner_conn.close()
        await writer.close()

    assert writes_in_a_chunk, "no UPDATE committed while a chunk was being read"
    assert table_locks and table_locks <= {"AccessShareLock", "RowShareLock"}, table_locks
    assert all(s.state in ("active", "idle") for s in samples), {s.state for s in samples}
    idle = [s for s in samples if s.state == "idle"]
    assert idle, "never caught the runner between chunks"
    assert all(s.xmin is None and s.xact_start is None for s in idle), "a snapshot held between chunks"
    chunks = [s for s in samples if s.state == "active" and s.xmin is not None]
    assert len({s.xact_start for s in chunks}) >= 3, "chunks are not separate transactions"
    xmins = [s.xmin for s in chunks if s.xmin is not None]
    assert xmins == sorted(xmins) and xmins[-1] > xmins[0], "the runner's snapshot did not move on"
    longest = max(s.at - s.xact_start.timestamp() for s in chunks if s.xact_start is not None)
    whole = samples[-1].at - samples[0].at
    assert longest < whole / 2, f"a transaction of {longest:.1f} s in a backfill of {whole:.1f} s"
