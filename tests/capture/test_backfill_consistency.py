"""A backfill racing live writers: no READ of an old row version is ever delivered after the change
that replaced it, and for every key the last event delivered is the row's final state."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import pytest

import pgferry
from pgferry.capture import backfill as backfills
from tests.capture.conftest import Running
from tests.helpers import read_all

ROWS = 2000
CHUNK = 50
WRITERS = 4


async def _writer(url: str, rng: random.Random, near: list[int], done: asyncio.Event) -> int:
    """Random updates, deletes and inserts of rows at and just ahead of the chunk being read; each
    transaction holds its change a moment before it commits, so commits land inside chunk reads."""
    conn = await asyncpg.connect(url)
    writes = 0
    try:
        while not done.is_set():
            key = max(1, near[0] + rng.randint(-CHUNK // 2, 2 * CHUNK))
            op = rng.random()
            async with conn.transaction():
                if op < 0.6:
                    await conn.execute("update t set v = v + 1, note = $2 where id = $1", key, f"w{writes}")
                elif op < 0.8:
                    await conn.execute("delete from t where id = $1", key)
                else:
                    await conn.execute(
                        "insert into t values ($1, 0, 'reborn') on conflict (id) do update set v = t.v + 100", key
                    )
                await asyncio.sleep(rng.random() * 0.004)
            writes += 1
    finally:
        await conn.close()
    return writes


async def _race(ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, seed: int) -> list[pgferry.Event]:
    """A backfill of t while WRITERS change the rows around the chunk being read; the events after."""
    await ferry.register_consumer("c")
    backfill = await backfills.start(conn, "public.t", chunk_size=CHUNK)

    near = [1]  # the first key of the chunk being read, for the writers to aim at

    def observe(done: int, _estimate: int | None, _chunk: int) -> None:
        near[0] = done + 1

    finished = asyncio.Event()
    rng = random.Random(seed)
    writers = [
        asyncio.create_task(_writer(db_url, random.Random(rng.random()), near, finished)) for _ in range(WRITERS)
    ]
    runner_conn = await asyncpg.connect(db_url)
    try:
        runner = backfills.BackfillRunner(
            runner_conn, backfills.BackfillSettings(backfill, max_rate=2500), observe=observe
        )
        assert await runner.run(asyncio.Event()) == "done"
    finally:
        finished.set()
        writes = sum(await asyncio.gather(*writers))
        await runner_conn.close()
    assert writes > 100, "the writers hardly ran: the test proves nothing"
    return await read_all(ferry, conn, "c")


async def _table(conn: asyncpg.Connection, method: str) -> None:
    await conn.execute("create table t (id int primary key, v int not null, note text)")
    await conn.execute(f"insert into t select g, 0, 'start' from generate_series(1, {ROWS}) g")
    await conn.execute("select ferry.capture_table('t', method => $1)", method)


def _final(events: list[pgferry.Event]) -> dict[str, dict[str, Any] | None]:
    """Each key's state after the events, in order (deleted keys left out), keyed as the table's rows."""
    state: dict[str, dict[str, Any] | None] = {}
    for e in events:
        assert e.key is not None
        state[e.key] = None if e.payload["type"] == "DELETE" else e.payload["record"]
    return {k: v for k, v in state.items() if v is not None}


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_writers_during_a_backfill_never_see_a_stale_read_after_a_newer_change(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, seed: int
) -> None:
    await _table(conn, "trigger")
    events = await _race(ferry, conn, db_url, seed)
    state: dict[str, dict[str, Any] | None] = {}
    reads = stale = 0
    for e in events:
        assert e.key is not None
        kind, record = e.payload["type"], e.payload["record"]
        if kind == "READ":
            reads += 1
            # A READ must show exactly the state the events before it left; a key with no earlier
            # event had not changed since the consumer began.
            if e.key in state and state[e.key] != record:
                stale += 1
        state[e.key] = None if kind == "DELETE" else record
    final = {str(r["id"]): dict(r) for r in await conn.fetch("select id, v, note from t")}
    assert stale == 0
    assert reads > ROWS // 2
    assert _final(events) == final


async def test_a_backfill_of_a_wal_captured_table_racing_writers_ends_on_each_rows_final_state(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, wal: Running
) -> None:
    """From the WAL a change enters the log after its commit, so a READ may come before the events
    of changes it already shows; never after one it does not. Each key's last event is its row."""
    await _table(conn, "wal")
    events = await _race(ferry, conn, db_url, 3)
    await wal.caught_up(conn)
    events += await read_all(ferry, conn, "c")
    assert sum(e.payload["type"] == "READ" for e in events) > ROWS // 2
    final = {str(r["id"]): dict(r) for r in await conn.fetch("select id, v, note from t")}
    assert _final(events) == final
