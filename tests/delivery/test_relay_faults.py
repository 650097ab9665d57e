"""Delivery across relay crashes and with several relays: nothing lost, each subscription owned once."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict

import asyncpg
import orjson

import pgferry
import pgferry.db
from pgferry.receiver import Receiver
from tests.helpers import MakeReceiver, RelayProcess, RunningRelay, eventually


def ids_of(receiver: Receiver) -> list[int]:
    return [int(r.headers["webhook-id"].removeprefix("evt_")) for r in receiver.received]


async def test_sigkill_mid_run_loses_nothing(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1, max_in_flight => 8)", url)
    relay = RelayProcess(pgferry_cmd, db_url)
    published: list[int] = []
    try:
        for round_ in range(3):
            for _ in range(10):
                published += await ferry.publish_many(
                    [{"stream": "s", "payload": {"r": round_, "n": n}} for n in range(50)]
                )
                await asyncio.sleep(0.02)
            half = len(published) // 2
            await eventually(lambda: _some_delivered(receiver, half), timeout=30, what="deliveries")  # noqa: B023
            relay.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(relay.proc.wait)
            relay = RelayProcess(pgferry_cmd, db_url)

        async def everything() -> bool:
            return set(published) <= set(ids_of(receiver))

        await eventually(everything, timeout=60, what="every event after the kills")
    finally:
        relay.stop()
    bodies: dict[str, set[bytes]] = defaultdict(set)
    for r in receiver.received:
        bodies[r.headers["webhook-id"]].add(r.body)
    assert all(len(b) == 1 for b in bodies.values())
    assert set(ids_of(receiver)) == set(published)


async def _some_delivered(receiver: Receiver, n: int) -> bool:
    return len(receiver.received) >= n


async def test_subscriptions_spread_over_relays_and_move_when_one_dies(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receivers = {}
    for name in ("a", "b", "c", "d"):
        receivers[name], url = await receiver_factory()
        await conn.execute("select ferry.subscribe($1, array['s'], $2)", name, url)
    relays = [RelayProcess(pgferry_cmd, db_url) for _ in range(2)]
    try:

        async def spread() -> bool:
            rows = await conn.fetch("select owned from ferry.relays where heartbeat_at > now() - interval '5 seconds'")
            owned = [set(r["owned"]) for r in rows]
            return len(owned) == 2 and all(len(o) == 2 for o in owned) and set().union(*owned) == set(receivers)

        await eventually(spread, timeout=30, what="two subscriptions per relay")
        first = await ferry.publish("s", {"n": 1})
        for receiver in receivers.values():
            await eventually(_has(receiver, first), what="delivery to every subscription")

        relays[0].proc.send_signal(signal.SIGKILL)

        async def survivor_owns_all() -> bool:
            rows = await conn.fetch("select owned from ferry.relays where heartbeat_at > now() - interval '5 seconds'")
            return any(set(r["owned"]) == set(receivers) for r in rows)

        await eventually(survivor_owns_all, timeout=20, what="the survivor to take every subscription")
        second = await ferry.publish("s", {"n": 2})
        for receiver in receivers.values():
            await eventually(_has(receiver, second), what="delivery after the takeover")
            assert ids_of(receiver).count(second) == 1
    finally:
        for relay in relays:
            relay.stop()


def _has(receiver: Receiver, event_id: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return event_id in ids_of(receiver)

    return check


# PostgreSQL restarts (fast and immediate) under delivery: tests/faults/test_postgres_restart.py.


async def test_a_database_s_short_statement_and_lock_timeouts_do_not_stall_the_relay(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """Outside probe: under `alter database ... set statement_timeout = '50ms'` a worker's read of a
    20,000-event transaction was cancelled at every try and the subscription stalled for good (status
    showed only lag); lock_timeout = '10ms' made the ticker step down again and again. The relay's
    sessions now set both to 0 (its own deadlines apply)."""
    database = await conn.fetchval("select current_database()")
    await conn.execute(f"alter database {database} set statement_timeout = '50ms'")
    await conn.execute(f"alter database {database} set lock_timeout = '10ms'")
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["public.big"], url, batch_size=100)
    await conn.execute("create table big (id int primary key, note text)")
    await ferry.capture_table("big")
    relay = RunningRelay(db_url)
    try:
        await conn.execute("insert into big select g, repeat('x', 200) from generate_series(1, 20000) g")

        def done() -> bool:
            return sum(len(orjson.loads(r.body)["data"]) for r in receiver.received) >= 20000

        await eventually(done, timeout=60, what="20,000 events of one transaction")
    finally:
        await relay.stop()
        await conn.execute(f"alter database {database} reset all")
