"""A backfill racing live writers: no READ of an old row version is ever delivered after the change
that replaced it, and for every key the last event delivered is the row's final state: read by a
consumer, delivered by a relay to an ordered webhook subscription, and from a WAL-captured table."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable
from typing import Any

import asyncpg
import pytest

import pgferry
from pgferry.capture import backfill as backfills
from tests.capture.conftest import Running
from tests.helpers import MakeReceiver, RunningRelay, eventually, read_all

ROWS = 2000
CHUNK = 50
WRITERS = 4

#: One event as the checks see it: its type, its key, and the row it shows (None for a DELETE),
#: with the row it removed or replaced (the old_record: from the WAL, of a DELETE only the key).
Seen = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]


async def _writer(url: str, rng: random.Random, near: list[int], chunk: int, spread: float, done: asyncio.Event) -> int:
    """Random updates, deletes and inserts of rows at and just ahead of the chunk being read (a share
    ``spread`` of them anywhere ahead of it, up to the table's end); each
    transaction holds its change a moment before it commits, so commits land inside chunk reads.
    Every write gives the row the next number of one sequence (``ver``), so each key's versions
    go up whatever happens to it: a row deleted and inserted again does not start over."""
    conn = await asyncpg.connect(url)
    writes = 0
    try:
        while not done.is_set():
            ahead = rng.randint(0, ROWS) if rng.random() < spread else rng.randint(-chunk // 2, 2 * chunk)
            key = max(1, near[0] + ahead)
            op = rng.random()
            async with conn.transaction():
                if op < 0.6:
                    await conn.execute(
                        "update t set v = v + 1, note = $2, ver = nextval('ver') where id = $1", key, f"w{writes}"
                    )
                elif op < 0.8:
                    await conn.execute("delete from t where id = $1", key)
                else:
                    await conn.execute(
                        "insert into t values ($1, 0, 'reborn') "
                        "on conflict (id) do update set v = t.v + 100, ver = nextval('ver')",
                        key,
                    )
                await asyncio.sleep(rng.random() * 0.004)
            writes += 1
    finally:
        await conn.close()
    return writes


async def _race(
    conn: asyncpg.Connection,
    db_url: str,
    seed: int,
    *,
    chunk: int = CHUNK,
    max_rate: float = 2500,
    spread: float = 0.0,
    **target: str,
) -> int:
    """A backfill of t (for ``target``: subscription or consumer, or everyone) while WRITERS change the
    rows around the chunk being read; the number of writes they made."""
    backfill = await backfills.start(conn, "public.t", chunk_size=chunk, **target)

    near = [1]  # the first key of the chunk being read, for the writers to aim at

    def observe(done: int, _estimate: int | None, _chunk: int) -> None:
        near[0] = done + 1

    finished = asyncio.Event()
    rng = random.Random(seed)
    writers = [
        asyncio.create_task(_writer(db_url, random.Random(rng.random()), near, chunk, spread, finished))
        for _ in range(WRITERS)
    ]
    runner_conn = await asyncpg.connect(db_url)
    try:
        runner = backfills.BackfillRunner(
            runner_conn, backfills.BackfillSettings(backfill, max_rate=max_rate), observe=observe
        )
        assert await runner.run(asyncio.Event()) == "done"
    finally:
        finished.set()
        writes = sum(await asyncio.gather(*writers))
        await runner_conn.close()
    return writes


async def _table(conn: asyncpg.Connection, method: str, rows: int = ROWS) -> None:
    await conn.execute("create sequence ver")
    await conn.execute(
        "create table t (id int primary key, v int not null, note text, ver bigint not null default nextval('ver'))"
    )
    await conn.execute(f"insert into t select g, 0, 'start' from generate_series(1, {rows}) g")
    await conn.execute("select ferry.capture_table('t', method => $1)", method)


def _seen(events: Iterable[pgferry.Event]) -> list[Seen]:
    out: list[Seen] = []
    for e in events:
        assert e.key is not None
        out.append((e.payload["type"], e.key, e.payload["record"], e.payload["old_record"]))
    return out


def _stale_reads(events: list[Seen]) -> tuple[int, int]:
    """READs whose row differs from the state the events of their key before them left (a key with
    no earlier event had not changed since the reader began): (READs, stale ones)."""
    state: dict[str, dict[str, Any] | None] = {}
    reads = stale = 0
    for kind, key, record, _old in events:
        if kind == "READ":
            reads += 1
            if key in state and state[key] != record:
                stale += 1
        state[key] = None if kind == "DELETE" else record
    return reads, stale


def _older_reads(events: list[Seen]) -> tuple[int, int]:
    """READs showing an older version of their row (``ver``) than an earlier event of their key showed,
    or the very version a DELETE before them removed: (READs checked against an earlier event, older ones)."""
    newest: dict[str, tuple[int, bool]] = {}  # key -> (the highest ver shown, deleted since)
    checked = older = 0
    for kind, key, record, old in events:
        ver, deleted = newest.get(key, (-1, False))
        if kind == "DELETE":
            removed = (old or {}).get("ver")  # from the WAL, a DELETE carries the key only
            newest[key] = (max(ver, -1 if removed is None else int(removed)), True)
            continue
        assert record is not None
        shown = int(record["ver"])
        if kind == "READ" and key in newest:
            checked += 1
            older += shown < ver or (deleted and shown <= ver)
        newest[key] = (max(ver, shown), False)
    return checked, older


def _final(events: list[Seen]) -> dict[str, dict[str, Any]]:
    """Each key's state after the events, in order (deleted keys left out), keyed as the table's rows."""
    state: dict[str, dict[str, Any] | None] = {}
    for kind, key, record, _old in events:
        state[key] = None if kind == "DELETE" else record
    return {k: v for k, v in state.items() if v is not None}


async def _rows(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    return {str(r["id"]): dict(r) for r in await conn.fetch("select id, v, note, ver from t")}


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_writers_during_a_backfill_never_see_a_stale_read_after_a_newer_change(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, seed: int
) -> None:
    await _table(conn, "trigger")
    await ferry.register_consumer("c")
    writes = await _race(conn, db_url, seed)
    assert writes > 100, "the writers hardly ran: the test proves nothing"
    events = _seen(await read_all(ferry, conn, "c"))
    reads, stale = _stale_reads(events)
    assert stale == 0
    assert reads > ROWS // 2
    assert _older_reads(events)[1] == 0
    assert _final(events) == await _rows(conn)


async def test_a_backfill_racing_writers_reaches_an_ordered_webhook_through_a_relay_in_key_order(
    conn: asyncpg.Connection, db_url: str, receiver_factory: MakeReceiver
) -> None:
    """The same race, delivered by a real relay to a real receiver: an ordered subscription sends a
    key's next event only once the one before it was answered, so each key's requests arrive in the
    log's order, and the same checks hold on what the receiver got."""
    rows = 600
    await _table(conn, "trigger", rows)
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['public.t'], $1, ordered => true)", url)
    relay = RunningRelay(db_url)
    try:
        writes = await _race(conn, db_url, 4, chunk=25, max_rate=1000, subscription="hook")
        assert writes > 50, "the writers hardly ran: the test proves nothing"
        logged = int(await conn.fetchval("select count(*) from ferry.events where stream = 'public.t'"))

        async def delivered() -> bool:
            return len(receiver.received) >= logged

        await eventually(delivered, timeout=60, what=f"the {logged} events to reach the receiver")
    finally:
        await relay.stop()
    events: list[Seen] = []
    for request in receiver.received:  # in the order they arrived
        body = json.loads(request.body)
        row = body["record"] if body["type"] != "DELETE" else body["old_record"]
        events.append((body["type"], str(row["id"]), body["record"], body["old_record"]))
    reads, stale = _stale_reads(events)
    assert stale == 0
    assert reads > rows // 2
    assert _older_reads(events)[1] == 0
    assert _final(events) == await _rows(conn)


async def test_a_backfill_of_a_wal_captured_table_racing_writers_never_reads_back_an_older_version(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, wal: Running
) -> None:
    """From the WAL a change enters the log after its commit, so a READ may come before the events
    of changes it already shows; never after one it does not: per key, a READ shows a version at
    least as new as every earlier event showed (newer than one a DELETE removed). Each key's last
    event is its row."""
    await _table(conn, "wal")
    await ferry.register_consumer("c")
    # Half the writes anywhere ahead: their changes are in the log before the chunk reaches their rows.
    writes = await _race(conn, db_url, 3, spread=0.5)
    assert writes > 100, "the writers hardly ran: the test proves nothing"
    raw = await read_all(ferry, conn, "c")
    await wal.caught_up(conn)
    events = _seen(raw + await read_all(ferry, conn, "c"))
    assert sum(kind == "READ" for kind, *_ in events) > ROWS // 2
    checked, older = _older_reads(events)
    assert older == 0
    assert checked > 10, "too few READs came after an event of their key: the test proves nothing"
    assert _final(events) == await _rows(conn)
