"""Idle subscriptions cost the database nothing each (issue 16, "many subscriptions").

A relay used to poll once a second per subscription for new batches and
twice for parked retries: 1,000 idle subscriptions were 3,000 transactions a
second. Now one LogWatch per relay polls for all of them, wakes only the
workers whose streams moved, and moves the others' cursors in one statement.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import orjson

import pgferry
from pgferry import db
from pgferry.delivery.context import DeliveryContext
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.in_flight import RelayInFlight
from pgferry.delivery.model import Subscription
from pgferry.delivery.watch import LogWatch
from pgferry.delivery.worker import SubscriptionWorker
from pgferry.receiver import Receiver, Respond
from pgferry.relay.process import RelaySettings
from tests.helpers import AfterQuery, MakeReceiver, RunningRelay, eventually, owns, received, tick

#: quiet subscriptions beside one busy one: 1,000 in all, the issue's number (measured 2026-12-04: 4.8
#: transactions/s for the whole idle relay; the test took 19.6 s, 17.3 s with 301 subscriptions)
QUIET = 999
#: backends report their transaction counts at most once a second when busy, and up to
#: 10 s late once idle (PGSTAT_IDLE_INTERVAL): the start-up burst must land before the window
STATS_FLUSH_S = 1.2
SETTLE_S = 11.0
XACTS = "select xact_commit + xact_rollback from pg_stat_database where datname = current_database()"


async def _xacts(conn: asyncpg.Connection) -> int:
    await conn.execute("select pg_stat_clear_snapshot()")
    return int(await conn.fetchval(XACTS))


async def test_idle_subscriptions_cost_no_queries_of_their_own_and_keep_up_with_the_log(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start(path="")
    await conn.execute(
        "select ferry.subscribe('quiet-' || n, array['quiet'], $1 || '/quiet') from generate_series(1, $2) n",
        url, QUIET,
    )  # fmt: skip
    await ferry.subscribe("busy", ["busy"], url + "/busy")
    # The default ticker, ownership rounds and fallback poll, as `pgferry run` has them.
    relay = RunningRelay(db_url, RelaySettings())
    try:
        await eventually(lambda: owns(relay.relay, QUIET + 1), timeout=30, what="the relay owning every subscription")

        # Writes to another stream: the busy subscription gets them, and the quiet ones'
        # cursors follow the log without a read of their own.
        for n in range(10):
            await ferry.publish("busy", {"n": n})
            await asyncio.sleep(0.05)
        await eventually(lambda: received(receiver, 10, "/busy"), what="the busy subscription's events")
        last = int(await conn.fetchval("select max(id) from ferry.ticks"))

        async def quiet_caught_up() -> bool:
            behind = await conn.fetchval(
                "select count(*) from ferry.consumers where name like 'webhook:quiet-%' and tick_id < $1", last
            )
            return int(behind) == 0

        await eventually(quiet_caught_up, timeout=10, what="the quiet subscriptions' cursors passing the busy ticks")

        # Idle: the whole relay, with 1,000 subscriptions, runs a few transactions a second.
        await asyncio.sleep(SETTLE_S)
        before, started = await _xacts(conn), time.monotonic()
        await asyncio.sleep(3.0)
        await asyncio.sleep(STATS_FLUSH_S)
        after = await _xacts(conn)
        rate = (after - before - 2) / (time.monotonic() - started)  # our own two reads left out
        assert rate <= 10, f"{rate:.1f} transactions/s with {QUIET + 1} idle subscriptions"

        # A quiet subscription still gets its event at once when its stream moves.
        await ferry.publish("quiet", {"hello": True})
        await eventually(lambda: received(receiver, QUIET, "/quiet"), timeout=20, what="the quiet event everywhere")
    finally:
        await relay.stop()
        await receiver.stop()
    assert len([r for r in receiver.received if r.path.startswith("/quiet")]) == QUIET  # exactly once each


async def test_a_stream_added_to_an_idle_subscription_is_not_skipped_before_the_relay_sees_the_change(
    db_url: str, ferry: pgferry.Ferry
) -> None:
    """The LogWatch judges idle subscriptions by their streams in the database, not by what the
    relay last read of them (it rereads settings every claim_interval, here 2 s)."""
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start(path="")
    for name in ("a", "other"):
        await ferry.subscribe(name, [name], f"{url}/{name}")
    relay = RunningRelay(db_url, RelaySettings())
    try:
        await eventually(lambda: owns(relay.relay, 2), timeout=30, what="the relay owning both subscriptions")
        await ferry.publish("a", {"n": 0})
        await eventually(lambda: received(receiver, 1, "/a"), what="the first event")
        await asyncio.sleep(0.5)  # both idle again
        await ferry.subscribe("a", ["a", "b"], f"{url}/a")  # the relay reads this on its next round
        await ferry.publish("b", {"n": 1})
        await eventually(lambda: received(receiver, 2, "/a"), timeout=10, what="the event on the added stream")
    finally:
        await relay.stop()
        await receiver.stop()


class _Worker:
    """What LogWatch.notify looks at of a worker."""

    def __init__(self, idle_at: int | None, hot: bool) -> None:
        self.idle_at, self.hot, self.wake = idle_at, hot, asyncio.Event()


def test_a_tick_wakes_a_busy_subscription_at_once_and_asks_about_the_idle_ones() -> None:
    """With several idle workers the LogWatch asks which streams moved before waking them; one
    that read events a moment ago is woken at once, without waiting for that round trip."""
    hot, cold = _Worker(5, hot=True), _Worker(5, hot=False)
    watch = LogWatch(None, lambda: [hot, cold])  # type: ignore[arg-type, list-item]
    watch.known = 5
    watch.notify(6)
    assert hot.wake.is_set() and not cold.wake.is_set()
    assert watch._poke.is_set() and watch.known == 5  # the round decides for the idle one
    alone = _Worker(6, hot=False)
    watch = LogWatch(None, lambda: [alone])  # type: ignore[arg-type, list-item]
    watch.known = 6
    watch.notify(7)
    assert alone.wake.is_set() and not watch._poke.is_set() and watch.known == 7


def _batched_ids(receiver: Receiver) -> list[int]:
    """The event ids of the batches ``receiver`` got, in the order it got them."""
    return [e["id"] for r in receiver.received for e in orjson.loads(r.body)["data"]]


class _SlowWatchRound(AfterQuery):
    """The relay's pool, except that the LogWatch's query, once answered (``asked`` set), waits
    for ``answer`` before its round goes on: a round trip slow enough (a busy machine) for a tick
    notification to come and its events to be delivered meanwhile."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool, "fetchrow", "log_watch", self._held)
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()
        self.answer.set()

    async def _held(self, _: object) -> None:
        self.asked.set()
        await self.answer.wait()


async def test_a_round_answered_after_a_newer_tick_does_not_move_an_idle_worker_back(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """A round's query answered with the newest tick it saw, older than the one a notification
    handed out meanwhile: the LogWatch took it as new, and moved a worker that had delivered
    the newer tick's events and was waiting at it back over "empty" ticks (skip(newer, older)).
    Its acknowledgement ended at the older tick, and its next read sent those events again,
    answered 200 the first time (outside probe: a batch of an ordered subscription delivered twice
    with no fault, 215 ms apart)."""
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('s', array['s'], $1, batch_size => 10, ordered => true)", url)
    sub = Subscription.from_row(await conn.fetchrow("select * from ferry.subscriptions where name = 's'"))
    pool = await db.create_pool(db_url, min_size=1, max_size=4)
    slow = _SlowWatchRound(pool)
    http = FastSender()
    ctx = DeliveryContext(pool=slow, http=http, global_limit=RelayInFlight(10))
    worker = SubscriptionWorker(sub, ctx)
    watch = LogWatch(ctx, lambda: [worker])
    run = asyncio.create_task(worker.run())
    try:
        start = await conn.fetchval("select max(id) from ferry.ticks")
        await eventually(lambda: worker.idle_at == start, what="the worker waiting at the newest tick")
        await watch._round(check_retries=False)
        assert watch.known == start
        await eventually(lambda: worker.idle_at == start and not worker.wake.is_set(),
                         what="the worker, woken by that round, waiting again")  # fmt: skip

        # A round (the fallback poll) whose answer, "nothing new", is slow to come back ...
        slow.answer.clear()
        slow.asked.clear()
        round_ = asyncio.create_task(watch._round(check_retries=False))
        await asyncio.wait_for(slow.asked.wait(), 10)
        # ... while a tick with an event is notified, read, delivered and waits to be acknowledged.
        first = await ferry.publish("s", {"n": 1}, key="k1")
        newer = await tick(conn)
        watch.notify(newer)
        await eventually(lambda: worker.idle_at == newer, what="the worker waiting at the newer tick")
        slow.answer.set()
        await round_
        await watch._flush()

        second = await ferry.publish("s", {"n": 2}, key="k2")
        watch.notify(await tick(conn))
        await eventually(lambda: second in _batched_ids(receiver), what="the second event")
        await asyncio.sleep(0.3)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)
        await http.close()
        await pool.close()
    ids = _batched_ids(receiver)
    assert sorted(ids) == [first, second], f"delivered {ids}: the first event again"
    cursor = await conn.fetchval("select tick_id from ferry.consumers where name = 'webhook:s'")
    assert cursor >= newer
