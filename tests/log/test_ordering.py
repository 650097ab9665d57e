"""The log's core promise under concurrency: every committed event is read exactly
once, rolled-back ones never, and events of one key in commit order."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field

import asyncpg

import pgferry
from pgferry import db
from tests.helpers import tick

KEYS = [f"k{i}" for i in range(8)]


@dataclass
class Ledger:
    committed: set[int] = field(default_factory=set)
    rolled_back: set[int] = field(default_factory=set)
    writers_done: int = 0


async def _writer(url: str, ferry: pgferry.Ferry, rng: random.Random, ledger: Ledger, n_tx: int, w: int) -> None:
    conn = await db.connect(url)
    try:
        for i in range(n_tx):
            isolation = "repeatable_read" if rng.random() < 0.2 else "read_committed"
            tx = conn.transaction(isolation=isolation)
            await tx.start()
            if isolation == "repeatable_read":
                await conn.fetchval("select count(*) from ferry.consumers")  # take the snapshot early
                await asyncio.sleep(rng.uniform(0, 0.02))
            key = rng.choice(KEYS)
            # The key's lock serializes its writers until commit, so n (taken
            # under the lock) increases in that key's commit order.
            await conn.execute("select pg_advisory_xact_lock(hashtext($1))", key)
            n = await conn.fetchval("select nextval('commit_order')")
            count = rng.randint(1, 3)
            ids = await ferry.publish_many(
                [{"stream": f"s{j % 2}", "payload": {"key": key, "n": n, "sub": j, "w": w, "i": i}, "key": key}
                 for j in range(count)],
                conn=conn,
            )  # fmt: skip
            await asyncio.sleep(rng.uniform(0, 0.015))
            if rng.random() < 0.2:
                await tx.rollback()
                ledger.rolled_back.update(ids)
            else:
                await tx.commit()
                ledger.committed.update(ids)
    finally:
        ledger.writers_done += 1
        await conn.close()


async def _long_transaction(url: str, ferry: pgferry.Ferry, ledger: Ledger, hold: float, commit: bool) -> None:
    conn = await db.connect(url)
    try:
        tx = conn.transaction()
        await tx.start()
        ids = await ferry.publish_many(
            [{"stream": "s0", "payload": {"key": "long", "n": j, "sub": 0}, "key": f"long-{commit}"} for j in range(3)],
            conn=conn,
        )
        await asyncio.sleep(hold)  # held open across many ticks and rotations
        if commit:
            await tx.commit()
            ledger.committed.update(ids)
        else:
            await tx.rollback()
            ledger.rolled_back.update(ids)
    finally:
        ledger.writers_done += 1
        await conn.close()


async def _ticker(url: str, rng: random.Random, stop: asyncio.Event, maintenance_log: list[str]) -> None:
    conn = await db.connect(url)
    try:
        n = 0
        while not stop.is_set():
            await tick(conn)
            n += 1
            if n % 10 == 0:
                maintenance_log.extend(await conn.fetchval("select ferry.maintain()"))
            await asyncio.sleep(rng.uniform(0.002, 0.03))
    finally:
        await conn.close()


async def test_concurrent_writers_every_committed_event_exactly_once(db_url: str, ferry: pgferry.Ferry) -> None:
    seed = int(os.environ.get("PGFERRY_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed={seed} (rerun with PGFERRY_TEST_SEED={seed})")
    rng = random.Random(seed)
    setup = await db.connect(db_url)
    await setup.execute("create sequence commit_order")
    await setup.execute("update ferry.config set rotation_interval = '0 s'")  # rotate as often as possible
    await setup.close()
    await ferry.register_consumer("stress")

    ledger = Ledger()
    stop_ticker = asyncio.Event()
    maintenance_log: list[str] = []
    n_writers = 6
    tasks = [
        *(_writer(db_url, ferry, random.Random(rng.random()), ledger, 60, w) for w in range(n_writers)),
        _long_transaction(db_url, ferry, ledger, hold=2.5, commit=True),
        _long_transaction(db_url, ferry, ledger, hold=1.5, commit=False),
    ]
    ticker = asyncio.create_task(_ticker(db_url, random.Random(rng.random()), stop_ticker, maintenance_log))

    received: list[pgferry.Event] = []

    async def read() -> None:
        async for batch in ferry.read("stress", max_events=rng.choice([5, 50, 5000]), poll_interval=0.1):
            received.extend(batch.events)
            await batch.ack()
            if ledger.writers_done == len(tasks) and {e.id for e in received} >= ledger.committed:
                return

    reader = asyncio.create_task(read())
    await asyncio.gather(*tasks)
    await asyncio.wait_for(reader, 30)

    # With writers gone, idle ticks move the cursor past the last in-flight
    # transactions, and retention truncates what every consumer has passed.
    async def drain() -> None:
        async for batch in ferry.read("stress", poll_interval=0.1):
            received.extend(batch.events)
            await batch.ack()

    setup = await db.connect(db_url)
    await setup.execute("update ferry.config set idle_tick_interval = '0 s'")
    await setup.close()
    drainer = asyncio.create_task(drain())
    for _ in range(100):
        if any("truncated" in m for m in maintenance_log):
            break
        await asyncio.sleep(0.1)
    drainer.cancel()
    stop_ticker.set()
    await ticker

    ids = [e.id for e in received]
    assert len(ids) == len(set(ids)), "an event was read twice"
    assert set(ids) == ledger.committed, (
        f"missing {sorted(ledger.committed - set(ids))[:10]}, unexpected {sorted(set(ids) - ledger.committed)[:10]}"
    )
    assert not set(ids) & ledger.rolled_back
    assert len(ledger.committed) > 200 and len(ledger.rolled_back) > 20

    by_key: dict[str, list[tuple[int, int]]] = {}
    for e in received:
        by_key.setdefault(e.key or "", []).append((e.payload["n"], e.payload["sub"]))
    for key, seen in by_key.items():
        assert seen == sorted(seen), f"key {key} out of commit order: {seen}"

    # Retention ran under the load: partitions were rotated, closed and truncated.
    assert any("truncated" in m for m in maintenance_log), maintenance_log


async def test_newest_transaction_committing_after_a_tick_is_ticked(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """A snapshot does not list running xids at or above its xmax: the writer holding
    the newest xid is invisible to the in-progress check, yet must still get a tick."""
    writer = await db.connect(db_url)
    try:
        tx = writer.transaction()
        await tx.start()
        await ferry.publish("s", {"n": 1}, conn=writer)
        assert await tick(conn) is not None  # the event counter moved; the writer is still running
        await tx.commit()
        assert await tick(conn) is not None, "the committed event waited for the idle tick"
        assert await tick(conn) is None
    finally:
        await writer.close()
