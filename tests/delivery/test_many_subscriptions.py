"""Many subscriptions sharing one endpoint: no duplicates without a fault.

With 1,000 subscriptions on one host:port, their requests queue for the
endpoint's pooled connections far longer than the second after which a round
lets go of slow requests. A request still waiting for a connection at that
moment has not reached the wire: it must be taken back, not counted as in
flight and then sent twice (issue 11, defect 9: 4-6% duplicates)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import asyncpg

import pgferry
from pgferry.receiver import Receiver, Respond, Slow
from tests.helpers import FAST, RunningRelay, eventually

SUBSCRIPTIONS = 1000
EVENTS = 10


async def test_a_thousand_subscriptions_on_one_endpoint_get_every_event_exactly_once(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    receiver = Receiver(lambda _: Slow(0.002, Respond()))
    url = await receiver.start()
    # A request let go of is parked "in flight" until its timeout (here 1.5 s) plus a margin has
    # passed; two connections answering in 2 ms each make the queue for them longer than that.
    await conn.execute(
        "select ferry.subscribe('sub-' || n, array['s'], $1 || '/' || n, timeout_ms => 1500)"
        " from generate_series(1, $2) n",
        url, SUBSCRIPTIONS,
    )  # fmt: skip
    relay = RunningRelay(db_url, dataclasses.replace(FAST, pool_size=2))
    try:
        await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(EVENTS)])

        async def all_arrived() -> bool:
            return len(receiver.received) >= SUBSCRIPTIONS * EVENTS

        await eventually(all_arrived, timeout=120, what=f"{SUBSCRIPTIONS * EVENTS} deliveries")
        let_go = await conn.fetchval("select count(*) from ferry.retries")
    finally:
        await relay.stop()
        await receiver.stop()
    sent = Counter((r.path, r.headers["webhook-id"]) for r in receiver.received)
    twice = {k: n for k, n in sent.items() if n > 1}
    assert len(sent) == SUBSCRIPTIONS * EVENTS and not twice, (
        f"{len(twice)} sent more than once, e.g. {list(twice)[:3]}"
    )
    print(f"{len(sent)} deliveries, none twice; {let_go} events still parked when all had arrived")
