"""A slow request holds back its subscription for about a second, not for its timeout.

The batch lets go of a request unanswered after DeliveryContext.detach_after
(1 s): its events are parked as in flight, the cursor moves on, and the
answer is recorded when it comes.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import orjson

import pgferry
from pgferry.ops import inspect
from pgferry.receiver import Action, Hang, Received, Respond, Slow
from tests.delivery.conftest import RunningRelay
from tests.delivery.test_webhooks import FAST_RETRY, MakeReceiver, all_delivered, received_ids
from tests.helpers import eventually

SLOW_S = 6.0


def slow_for(slow_n: int, action: Action) -> object:
    """Answer ``action`` to the first request for the event whose payload n is ``slow_n``, 200 to the rest."""
    seen: set[int] = set()

    def behave(request: Received) -> Action:
        n = orjson.loads(request.body)["n"]
        if n == slow_n and n not in seen:
            seen.add(n)
            return action
        return Respond()

    return behave


async def _parked_in_flight(conn: asyncpg.Connection) -> list[int]:
    rows = await conn.fetch("select event_id from ferry.retries where last_error like 'in flight:%'")
    return [r["event_id"] for r in rows]


async def _publish_over(ferry: pgferry.Ferry, count: int, seconds: float, key: str | None = None) -> list[int]:
    ids = []
    for n in range(1, count + 1):
        ids.append(await ferry.publish("s", {"n": n}, key=key))
        await asyncio.sleep(seconds / count)
    return ids


async def test_a_slow_answer_does_not_hold_back_later_events(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory(slow_for(0, Slow(SLOW_S)))
    await conn.execute(f"select ferry.subscribe('slow', array['s'], $1, {FAST_RETRY})", url)
    await asyncio.sleep(0.5)  # the relay's next round starts the worker
    started = time.monotonic()
    slow = await ferry.publish("s", {"n": 0})
    later = await _publish_over(ferry, 20, 1.5)
    await all_delivered(receiver, set(later))
    assert time.monotonic() - started < SLOW_S - 2, "later events waited for the slow answer"
    assert slow not in received_ids(receiver)

    async def parked() -> bool:  # the receiver can see later requests before the batch's park commits
        return await _parked_in_flight(conn) == [slow]

    await eventually(parked, timeout=3, what="the slow event parked as in flight")
    traced = await inspect.trace(conn, slow)
    assert [s["state"] for s in traced.subscriptions if s["name"] == "slow"] == ["in flight (its batch moved on)"]

    await all_delivered(receiver, {slow})  # the answer comes after SLOW_S: recorded then, not sent again
    await eventually(_no_retries(conn), what="the late answer to be recorded")
    attempts = await conn.fetch("select attempt, status from ferry.attempts where event_id = $1", slow)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, 200)]
    assert received_ids(receiver).count(slow) == 1


async def test_a_request_that_times_out_after_being_let_go_is_retried(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory(slow_for(0, Hang()))
    await conn.execute(f"select ferry.subscribe('hangs', array['s'], $1, timeout_ms => 2500, {FAST_RETRY})", url)
    await asyncio.sleep(0.5)
    started = time.monotonic()
    hung = await ferry.publish("s", {"n": 0})
    later = await _publish_over(ferry, 10, 0.5)
    await all_delivered(receiver, set(later))
    assert time.monotonic() - started < 2.3, "later events waited for the hanging request's timeout"
    await all_delivered(receiver, {hung})  # timed out at 2.5 s, parked for a retry, then answered
    await eventually(_no_retries(conn), what="the retry to be recorded")
    attempts = await conn.fetch("select attempt, error_class from ferry.attempts where event_id = $1 order by 1", hung)
    assert [(a["attempt"], a["error_class"]) for a in attempts] == [(1, "timeout"), (2, None)]


async def test_per_key_order_holds_when_a_slow_request_is_let_go(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory(slow_for(0, Slow(3.0)))
    await conn.execute(f"select ferry.subscribe('ordered', array['s'], $1, ordered => true, {FAST_RETRY})", url)
    await asyncio.sleep(0.5)
    first = await ferry.publish("s", {"n": 0}, key="k")
    same_key = await _publish_over(ferry, 5, 0.5, key="k")
    other_keys = [await ferry.publish("s", {"n": 100 + n}, key=f"other-{n}") for n in range(5)]
    await all_delivered(receiver, set(other_keys))
    assert not set(same_key) & set(received_ids(receiver)), "events of key k overtook the slow one"
    await all_delivered(receiver, {first, *same_key})
    in_key_order = [i for i in received_ids(receiver) if i in {first, *same_key}]
    assert in_key_order == [first, *same_key]


def _no_retries(conn: asyncpg.Connection):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return await conn.fetchval("select count(*) from ferry.retries") == 0  # type: ignore[no-any-return]

    return check
