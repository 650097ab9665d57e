"""Ownership epochs: a relay that lost a subscription can neither read, record nor advance it.

When only a relay's ownership connection dies, its subscription locks go
with it and another relay claims them at once, while the first relay's
workers, on other connections, have not noticed yet (here: it does not look
at its ownership connection for a minute). Without fencing both relays read
and send the same batches until the first one notices; with it, the first
one's next read or recording fails (PF002) and that worker stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import asyncpg
import orjson
import pytest

import pgferry
from pgferry import db, sql
from pgferry.receiver import Receiver, Respond
from pgferry.relay.ownership import Ownership, OwnershipSettings
from pgferry.schema import CONSUMER_LOCK_CLASS
from tests.helpers import FAST, RunningRelay, eventually

EVENTS = 300


async def test_a_relay_that_lost_its_ownership_connection_stops_delivering_at_once(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start()
    await ferry.subscribe("s", ["s"], url)
    # Relay A does not notice its ownership connection going away: no termination
    # listener, and its next ownership round is 14 s off.
    monkeypatch.setattr(Ownership, "_on_lost", lambda *_: None)
    a = RunningRelay(db_url, dataclasses.replace(FAST, ownership=OwnershipSettings(claim_interval=14)))
    b: RunningRelay | None = None
    lock_key = int(await conn.fetchval(sql.query("consumer_lock_key"), "webhook:s"))
    try:
        await eventually(lambda: _held(conn, lock_key), what="relay A owning the subscription")
        owner = await _lock_holder(conn, lock_key)

        async def publish() -> None:
            for n in range(EVENTS):
                await ferry.publish("s", {"n": n})
                await asyncio.sleep(0.01)

        writer = asyncio.create_task(publish())
        await eventually(lambda: _count(receiver, 20), what="relay A delivering")
        # Only A's ownership connection dies; B claims the subscription at once.
        await conn.execute("select pg_terminate_backend($1)", owner)
        b = RunningRelay(db_url)
        await writer
        await eventually(lambda: _count(receiver, EVENTS, distinct=True), timeout=30, what="every event")
        a_workers = a.relay.ownership.owned if a.relay.ownership else {}
        a_stopped = all(o.task.done() for o in a_workers.values())
    finally:
        await asyncio.gather(a.stop(), *([b.stop()] if b else []))
        await receiver.stop()
    seen = Counter(orjson.loads(r.body)["n"] for r in receiver.received)
    dupes = sum(c - 1 for c in seen.values())
    assert len(seen) == EVENTS
    # What A had read before B's claim may go out twice (at-least-once); nothing after.
    assert dupes <= 20, f"{dupes} events delivered twice"
    assert a_stopped, "relay A still delivers the subscription"


async def _lock_holder(conn: asyncpg.Connection, key: int) -> int | None:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "select pid from pg_locks where locktype = 'advisory' and classid = $1 and objid = $2 and granted",
        CONSUMER_LOCK_CLASS, key,
    )  # fmt: skip


async def _held(conn: asyncpg.Connection, key: int) -> bool:
    return await _lock_holder(conn, key) is not None


async def _count(receiver: Receiver, n: int, *, distinct: bool = False) -> bool:
    bodies = [r.body for r in receiver.received]
    return len(set(bodies) if distinct else bodies) >= n


async def test_one_statement_claims_a_round_skipping_consumers_held_by_a_relay_or_being_recorded(
    conn: asyncpg.Connection, db_url: str, ferry: pgferry.Ferry
) -> None:
    """ferry._claim_consumers: in order, up to `most`; one another session holds the lock of is not
    returned, one whose row a recording holds comes back with no epoch and its lock given back."""
    for name in ("a", "b", "c", "d"):
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/x")
    other = await db.connect(db_url)
    try:
        await other.execute("select pg_advisory_lock(77, hashtext('webhook:a'))")  # another relay owns a
        recording = other.transaction()
        await recording.start()
        await other.execute(
            "select ferry._fence('webhook:b', owner_epoch) from ferry.consumers where name = 'webhook:b'"
        )
        claim = "select consumer, epoch from ferry._claim_consumers(77, $1::text[], $2)"
        names = ["webhook:a", "webhook:b", "webhook:c", "webhook:d"]
        rows = [tuple(r) for r in await conn.fetch(claim, names, 1)]
        assert rows == [("webhook:b", None), ("webhook:c", 1)]
        await recording.rollback()
        rest = ["webhook:a", "webhook:b", "webhook:d"]  # a relay does not ask for what it owns
        assert [tuple(r) for r in await conn.fetch(claim, rest, 5)] == [("webhook:b", 1), ("webhook:d", 1)]
        locks = await conn.fetchval(
            "select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()"
        )
        assert locks == 3  # b, c and d: b's was given back the first time, taken the second
    finally:
        await other.close()
