"""A slow request holds back its subscription for about a second, not for its timeout.

The batch lets go of a request unanswered after DeliveryContext.detach_after
(1 s): its events are parked as in flight, the cursor moves on, and the
answer is recorded when it comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg
import orjson

import pgferry
from pgferry import db
from pgferry.delivery.bookkeeping import IN_FLIGHT_NOTE
from pgferry.delivery.context import DeliveryContext
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.in_flight import RelayInFlight
from pgferry.delivery.model import Subscription
from pgferry.delivery.worker import SubscriptionWorker
from pgferry.ops import inspect
from pgferry.receiver import Action, Hang, Received, Respond, Slow
from tests.helpers import (
    FAST_RETRY,
    AfterQuery,
    MakeReceiver,
    RunningRelay,
    all_delivered,
    eventually,
    received_ids,
)

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


async def _park_due(conn: asyncpg.Connection, event: int, note: str | None) -> None:
    """Park ``event`` for subscription s, due now, with ``note`` as its last error."""
    await conn.execute(
        """insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                                      attempts, first_failed_at, next_attempt_at, last_error)
           select 's', e.id, e.stream, e.key, e.payload, e.headers, e.created_at, 0, now(), now(), $2
           from ferry.events e where e.id = $1""",
        event, note,
    )  # fmt: skip


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
    attempts = await conn.fetch("select attempt, status from ferry.attempt_history() where event_id = $1", slow)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, 200)]
    assert received_ids(receiver).count(slow) == 1


async def test_a_round_still_getting_answers_is_not_let_go_of(
    relay: RunningRelay, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """Eight requests one after another, 0.3 s each: the round takes 2.4 s, no request is slow,
    so none is let go of (parked as in flight, its answer recorded later as a retry's)."""
    receiver, url = await receiver_factory(lambda request: Slow(0.3, Respond()))
    await conn.execute(
        f"select ferry.subscribe('steady', array['s'], $1, batch_size => 1, max_in_flight => 1, {FAST_RETRY})", url
    )
    await asyncio.sleep(0.5)
    ids = await conn.fetchval(
        "select array_agg(ferry.publish('s', jsonb_build_object('n', g))) from generate_series(1, 8) g"
    )
    await all_delivered(receiver, set(ids))

    async def recorded() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.attempt_history()") == len(ids))

    await eventually(recorded, what="every attempt recorded")
    # acknowledged with the batch (ferry.deliveries), not recorded late one request at a time
    assert await conn.fetchval("select count(*) from ferry.attempts") == 0
    assert sorted(received_ids(receiver)) == sorted(ids)


async def test_many_late_answers_are_each_recorded_once_with_their_own_outcome(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """Late answers that come together are recorded together: each with its own status."""
    first: set[int] = set()

    def behave(request: Received) -> Action:
        n = orjson.loads(request.body)["n"]
        if n in first:
            return Respond()
        first.add(n)
        return Slow(2.0, Respond(500 if n % 3 == 0 else 200))

    receiver, url = await receiver_factory(behave)
    await conn.execute(f"select ferry.subscribe('late', array['s'], $1, {FAST_RETRY})", url)
    await asyncio.sleep(0.5)
    ids = [await ferry.publish("s", {"n": n}) for n in range(24)]
    await all_delivered(receiver, set(ids))
    await eventually(_no_retries(conn), what="the late answers and the retries to be recorded")
    rows = await conn.fetch(
        "select event_id, array_agg(status order by attempt) as statuses from ferry.attempt_history()"
        " where subscription = 'late' group by event_id"
    )
    by_id = {r["event_id"]: r["statuses"] for r in rows}
    assert by_id == {i: ([500, 200] if n % 3 == 0 else [200]) for n, i in enumerate(ids)}


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
    attempts = await conn.fetch(
        "select attempt, error_class from ferry.attempt_history() where event_id = $1 order by 1", hung
    )
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


def _answered_during_fetch(pool: asyncpg.Pool, answered: Callable[[], Awaitable[None]]) -> AfterQuery:
    """The relay's pool, except that the retry loop's fetch of due retries returns what it read
    after the late answer to a request let go of was recorded meanwhile (row gone, no longer let
    go of): the race a busy machine showed (issue 16's probe, 145 of 100,000 events sent twice)."""

    async def hook(rows: object) -> None:
        if rows:
            await answered()

    return AfterQuery(pool, "fetch", "due_retries", hook)


async def test_an_answer_recorded_while_retries_are_fetched_is_not_sent_again(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute(f"select ferry.subscribe('s', array['s'], $1, {FAST_RETRY})", url)
    sub = Subscription.from_row(await conn.fetchrow("select * from ferry.subscriptions where name = 's'"))
    event = await ferry.publish("s", {"n": 1})
    # Parked as in flight and (its batch recorded late) already due; its request is let go of.
    await _park_due(conn, event, IN_FLIGHT_NOTE)
    pool = await db.create_pool(db_url, min_size=1, max_size=2)
    http = FastSender()
    worker: SubscriptionWorker | None = None

    async def answered() -> None:  # its late answer: recorded, and no longer let go of
        await conn.execute("delete from ferry.retries where event_id = $1", event)
        assert worker is not None
        worker.let_go.discard(event)

    try:
        ctx = DeliveryContext(pool=_answered_during_fetch(pool, answered), http=http,
                              global_limit=RelayInFlight(10))  # fmt: skip
        worker = SubscriptionWorker(sub, ctx)
        worker.let_go.add(event)
        retries = asyncio.create_task(worker._retry_loop())
        await asyncio.sleep(1.5)
        worker.stop()
        await asyncio.wait_for(retries, 10)
    finally:
        await http.close()
        await pool.close()
    assert event not in received_ids(receiver), "sent again though its answer was recorded"


async def test_with_ordering_a_key_whose_first_event_is_still_in_flight_waits_in_the_retry_loop(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """An in-flight row is due once timeout_ms and a margin have passed; when its answer is
    recorded later than that, the retry loop skipped it (still let go of) but sent the events of
    its key behind it: out of order (outside probe, 440 subscriptions on a busy machine)."""
    receiver, url = await receiver_factory()
    await conn.execute(f"select ferry.subscribe('s', array['s'], $1, ordered => true, {FAST_RETRY})", url)
    sub = Subscription.from_row(await conn.fetchrow("select * from ferry.subscriptions where name = 's'"))
    first = await ferry.publish("s", {"n": 1}, key="k")
    second = await ferry.publish("s", {"n": 2}, key="k")
    other = await ferry.publish("s", {"n": 3}, key="other")
    for event, note in ((first, IN_FLIGHT_NOTE), (second, None), (other, None)):
        await _park_due(conn, event, note)
    pool = await db.create_pool(db_url, min_size=1, max_size=2)
    http = FastSender()
    try:
        ctx = DeliveryContext(pool=pool, http=http, global_limit=RelayInFlight(10))
        worker = SubscriptionWorker(sub, ctx)
        worker.let_go.add(first)  # its request is still out there
        retries = asyncio.create_task(worker._retry_loop())
        await all_delivered(receiver, {other})
        await asyncio.sleep(0.5)
        worker.stop()
        await asyncio.wait_for(retries, 10)
    finally:
        await http.close()
        await pool.close()
    assert second not in received_ids(receiver), "sent before the event of its key still in flight"
