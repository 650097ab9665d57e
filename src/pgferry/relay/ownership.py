"""Which relay delivers which subscription (or partition of one).

What a relay claims is a consumer: a subscription's, or one partition's of a
subscription of several (migration 0018); "subscription" below means either.
Each relay keeps one "ownership" connection and holds a session advisory lock
per subscription it delivers. Locks vanish with the connection, so when a
relay dies its subscriptions are free at once and survivors claim them on
their next round (every ``claim_interval`` seconds). Relays heartbeat into
ferry.relays (for `pgferry status`) and hold a shared "presence" lock; each
claims at most its fair share (subscriptions / relays holding the presence
lock, rounded up) and hands back extras, so load spreads as relays join.
The same connection LISTENs for ticks and hands them to the LogWatch, which
wakes the workers concerned. After a change of partitions, the relay that
owns an old partition stops it once it has drained, and removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.delivery.context import DeliveryContext
from pgferry.delivery.http import endpoint_of, host_port
from pgferry.delivery.model import Subscription
from pgferry.delivery.watch import LogWatch
from pgferry.delivery.worker import SubscriptionWorker
from pgferry.log.reader import MOVED_CHANNEL, TICK_CHANNEL
from pgferry.log.timeline import check_timeline
from pgferry.schema import CONSUMER_LOCK_CLASS, LOCK_CLASS, PRESENCE_LOCK

log = logging.getLogger(__name__)

#: ferry._set_subscription_state: a subscription paused or disabled (its name)
PAUSED_CHANNEL = "pgferry_paused"
#: ferry.subscribe: a subscription made or changed (its name): the next round starts now
CHANGED_CHANNEL = "pgferry_changed"


#: Seconds a relay leaves alone a partition it handed over to spread its subscription (so that
#: the relay with room takes it, not this one again in its next round).
HANDED_OVER_HOLD = 10.0
#: a handed-over worker's wait beyond its requests' timeout: recording their answers
HAND_OVER_MARGIN = 1.0
#: Rounds after which the heartbeat writes the owned list though it did not change (its row may
#: have been removed and written again without it: pruned after an hour's silence, or by hand).
OWNED_AGAIN = 5


@dataclass
class OwnershipSettings:
    claim_interval: float = 2.0
    stop_grace: float = 10.0
    #: relays started together with this one (the processes of its supervisor): for its first
    #: peers_wait seconds its fair share counts at least that many, though the others have not
    #: shown up yet. The first process to start claimed every subscription and handed half back,
    #: each hand-over waiting up to stop_grace for a round under way: with a backlog half of the
    #: subscriptions delivered nothing for 15-35 s after each start (outside probe).
    peers: int = 1
    peers_wait: float = 10.0


@dataclass
class _Owned:
    worker: SubscriptionWorker
    task: asyncio.Task[None]
    lock_key: int


@dataclass
class _Leaving:
    """A subscription handed to another relay whose worker is finishing its requests in flight:
    its lock is given back once ``stopped`` is done, on the next round."""

    owned: _Owned
    stopped: asyncio.Task[None]


class Ownership:
    def __init__(
        self,
        url: str,
        ctx: DeliveryContext,
        settings: OwnershipSettings | None = None,
        liveness: db.Liveness | None = None,
    ) -> None:
        self.url = url
        # The ownership connection holds every subscription lock of this relay: it
        # must neither wait forever on a silent network nor outlive us on the server.
        live = liveness or db.Liveness()
        self.connect_kwargs = live.connect_kwargs("pgferry relay", holds_locks=True)
        self.ctx = ctx
        self.settings = settings or OwnershipSettings()
        self.relay_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.started_at = time.monotonic()
        self.owned: dict[str, _Owned] = {}
        #: the owned list the last heartbeat wrote, over which connection, and rounds since written
        self._sent_owned: list[str] | None = None
        self._sent_on: asyncpg.Connection | None = None
        self._rounds = 0
        #: subscriptions handed over whose workers are still finishing; this relay's session still
        #: holds their locks, and a session re-enters its own advisory locks: never claim them
        self.leaving: dict[str, _Leaving] = {}
        #: partitions handed over to spread their subscription, and when (see HANDED_OVER_HOLD)
        self._spread: dict[str, float] = {}
        #: metrics hook: seconds the heartbeat round trip took
        self.observe_round: Callable[[float], None] | None = None
        #: wakes the workers, with one query for all of them (delivery.watch)
        self.watch = LogWatch(ctx, lambda: [o.worker for o in self.owned.values()])
        #: set by a subscription's change (CHANGED_CHANNEL): the round waiting starts at once
        self._changed = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        watch = asyncio.create_task(self.watch.run(stop), name="log watch")
        try:
            await self._own(stop)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _own(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                conn = await db.connect(self.url, **self.connect_kwargs)
            except CONNECTION_ERRORS as exc:
                failures += 1
                delay = backoff_delay(failures, base=0.2, cap=db.RECONNECT_BACKOFF_CAP)
                log.warning("delivery: %s; retrying in %.1f s", exc, delay)
                await wait_for_event(stop, delay)
                continue
            try:
                failures = 0
                await self._refresh_instance(conn)
                await conn.fetchval(sql.query("announce_presence"), LOCK_CLASS, PRESENCE_LOCK)
                await conn.add_listener(TICK_CHANNEL, self._on_tick)
                await conn.add_listener(MOVED_CHANNEL, self._on_moved)
                await conn.add_listener(PAUSED_CHANNEL, self._on_paused)
                await conn.add_listener(CHANGED_CHANNEL, lambda *_: self._changed.set())
                conn.add_termination_listener(self._on_lost)
                while not stop.is_set():
                    await self._round(conn)
                    await self._pause(stop)
                await self._release_all(conn, graceful=True)
                await conn.execute(sql.query("relay_gone"), self.relay_id)
            except CONNECTION_ERRORS as exc:
                log.warning(
                    "delivery: lost the ownership connection (%s); stopping workers and reconnecting", db.describe(exc)
                )
                await wait_for_event(stop, self.settings.claim_interval)
            except Exception:
                failures += 1
                log.exception("delivery: unexpected error; stopping workers and starting over")
                await wait_for_event(stop, backoff_delay(failures, base=1.0, cap=30.0))
            finally:
                # The subscription locks live and die with this connection: no
                # worker may outlive it.
                await self._abandon_all()
                if not conn.is_closed():
                    conn.terminate()
        await self._abandon_all()

    async def _refresh_instance(self, conn: asyncpg.Connection) -> None:
        """Before any worker starts on this connection: a database promoted or restored since the
        last one moves its ids on and renames the install (log/timeline.py), and the workers made
        from here on put the name it has now in the brokers' duplicate checks. (Every worker
        stopped with the last connection, so none keeps the old name.)"""
        await check_timeline(conn)
        config = await conn.fetchrow(sql.query("relay_config"))
        if config is not None and config["instance"] != self.ctx.instance:
            if self.ctx.instance:
                log.info("delivery: this install's name in the brokers' duplicate checks is now %s (was %s)",
                         config["instance"], self.ctx.instance)  # fmt: skip
            self.ctx.instance = config["instance"]

    async def _pause(self, stop: asyncio.Event) -> None:
        """Waits claim_interval between rounds, or until a hand-over is done (its lock goes back at
        once) or a subscription changed (its workers take the new settings at once)."""
        stopping = asyncio.ensure_future(stop.wait())
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            handed = [leaving.stopped for leaving in self.leaving.values()]
            await asyncio.wait([stopping, changed, *handed], timeout=self.settings.claim_interval,
                               return_when="FIRST_COMPLETED")  # fmt: skip
        finally:
            stopping.cancel()
            changed.cancel()
        self._changed.clear()

    def _all_owned(self) -> list[_Owned]:
        """Every worker this relay runs: those it owns and those it is handing over."""
        return [*self.owned.values(), *(leaving.owned for leaving in self.leaving.values())]

    def _on_lost(self, *_: object) -> None:
        """The ownership connection is gone, and with it our locks: stop sending at once."""
        for owned in self._all_owned():
            owned.worker.stop()
            owned.task.cancel()

    def _on_tick(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.watch.notify(int(payload) if payload.isdigit() else None)

    def _on_moved(self, _conn: object, _pid: int, _channel: str, consumer: str) -> None:
        """Retention (or an operator's resume from now) moved a consumer's cursor over events it had
        not delivered: they are a gap now. Its worker stops sending at once what it read before
        (finishing its round sent a slow subscription's events for seconds after they were counted
        lost); the next round lets it go, and claims it again if it is still active."""
        for owned in self._all_owned():
            if owned.worker.sub.consumer == consumer and not owned.task.done():
                log.warning("delivery: the cursor of %s was moved over events it had not delivered (ferry.gaps); "
                            "it stops sending what it had read", consumer)  # fmt: skip
                owned.worker.stop()
                owned.task.cancel()

    def _on_paused(self, _conn: object, _pid: int, _channel: str, name: str) -> None:
        """A subscription was paused (or disabled): its workers stop starting requests now, not at the
        next round (up to claim_interval later, while events committed after the pause went out;
        outside probe). Those on the wire finish; the next round lets the subscription go."""
        for owned in self._all_owned():
            if owned.worker.sub.name == name and not owned.task.done():
                owned.worker.stop()

    async def _round(self, conn: asyncpg.Connection) -> None:
        # One round trip: heartbeat, active subscriptions, number of live relays
        # (those whose ownership connection holds the presence lock).
        await self._unlock_handed_over(conn)
        started = time.perf_counter()
        units = sorted(self.owned)
        # the list only when it changed (or every OWNED_AGAIN rounds, in case the row was removed)
        self._rounds = (self._rounds + 1) % OWNED_AGAIN
        same = units == self._sent_owned and self._rounds and conn is self._sent_on
        rows = await conn.fetch(
            sql.query("relay_round"),
            self.relay_id,
            socket.gethostname(),
            os.getpid(),
            None if same else units,
            orjson.dumps(self._stats()).decode(),
        )
        self._sent_owned, self._sent_on = units, conn
        if self.observe_round is not None:
            self.observe_round(time.perf_counter() - started)
        active = {sub.unit: sub for sub in map(Subscription.from_row, rows)}
        relays = max(1, rows[0]["live_relays"]) if rows else 1
        if time.monotonic() - self.started_at < self.settings.peers_wait:
            relays = max(relays, self.settings.peers)
        # Reap workers that ended on their own (e.g. 410 disabled them) or whose subscription went away.
        for name in list(self.owned):
            owned = self.owned[name]
            if name not in active or owned.task.done():
                await self._release(conn, name, graceful=True)
        for name, sub in list(active.items()):
            if sub.drained:  # an old partition, done: nobody delivers it any more
                await self._retire(conn, sub)
                del active[name]
            elif name in self.owned and self.owned[name].worker.sub != sub:
                try:
                    self.owned[name].worker.update(sub)
                except ValueError as exc:
                    log.error("delivery: keeping the old settings of subscription %s: %s", name, exc)

        share = math.ceil(len(active) / relays)
        # A hot subscription's partitions spread over the relays first: each takes at most its
        # share of every subscription's partitions (claiming in name order would put them together).
        # Counted as if every claim succeeds: one another relay holds leaves room for next round.
        held = Counter(o.worker.sub.generation for o in self.owned.values())
        wanted: list[tuple[str, Subscription]] = []
        capped: list[tuple[str, Subscription]] = []
        for name, sub in active.items():
            if name in self.owned or name in self.leaving:
                continue
            if held[sub.generation] >= math.ceil(sub.parts / relays):
                capped.append((name, sub))
                continue
            held[sub.generation] += 1
            wanted.append((name, sub))
        await self._claim(conn, wanted, share - len(self.owned))
        # ... a preference, not a rule: a partition no relay took (every relay with room already
        # holds its share of that subscription, the others are at their fair share) would wait
        # for a change of relays (an outside probe saw one stay unowned for 7 minutes). The
        # relays' fair shares add up to at least every unit, so one with room takes it here.
        now = time.monotonic()
        self._spread = {u: at for u, at in self._spread.items() if now - at < HANDED_OVER_HOLD}
        await self._claim(conn, [(n, sub) for n, sub in capped if n not in self._spread], share - len(self.owned))
        # Every extra at once: with several relays starting together, the first to claim takes
        # everything, and handing back one per round would take minutes with 1,000 subscriptions.
        # Partitions beyond this relay's share of their subscription go first (that spreads a hot
        # subscription), then whole subscriptions from the end of the name order. Only what is over
        # the fair share goes: handing over partitions regardless left one owned by nobody when
        # the other relays were at their fair share (grouped in one pass: one scan of the owned
        # per subscription cost an idle relay with 1,000 subscriptions 0.4 s a round).
        # Above the floor of the fair share, a relay also hands over the partitions it holds beyond
        # its share of their subscription: the relays' counts add up to every unit, so another relay
        # is then below its fair share and takes them (5 units over 4 relays, one relay held two
        # partitions of a 4-partition subscription at its fair share of 2 while another held nothing).
        floor = len(active) // relays
        extras: list[str] = []
        if len(self.owned) > floor:
            by_generation: defaultdict[tuple[str, int], list[str]] = defaultdict(list)
            for unit, owned in self.owned.items():
                by_generation[owned.worker.sub.generation].append(unit)
            beyond = [
                u for (_, parts), units in by_generation.items() for u in sorted(units)[math.ceil(parts / relays) :]
            ]
            if len(self.owned) > share:
                first = set(beyond)
                # the rest: whole subscriptions before a partition kept at its share (a stable sort)
                rest = sorted((u for u in sorted(self.owned, reverse=True) if u not in first),
                              key=lambda u: self.owned[u].worker.sub.parts > 1)  # fmt: skip
                extras = [*beyond, *rest][: len(self.owned) - share]
            else:
                extras = beyond[: len(self.owned) - floor]
                self._spread.update(dict.fromkeys(extras, now))
        if extras:
            log.info("delivery: handing %d subscription(s) to other relays (fair share %d)", len(extras), share)
            for name in extras:
                self._hand_over(name, self.owned.pop(name))

    def _hand_over(self, name: str, owned: _Owned) -> None:
        """Stops a worker in the background, letting its requests in flight take their own timeout:
        one cancelled was sent again by the next owner, answered or not (outside probe: a receiver
        answering in 15 s under timeout_ms 30000 got every event of the moved subscription twice).
        The rounds go on meanwhile (waiting here kept the ownership connection silent, so a wait had
        to end before PostgreSQL's idle_session_timeout: ~17 s by default), and the round after the
        worker stopped gives its lock back."""
        grace = max(self.settings.stop_grace, owned.worker.sub.timeout_ms / 1000 + HAND_OVER_MARGIN)
        stopped = asyncio.create_task(self._stop_worker(name, owned, True, grace), name=f"hand over {name}")
        self.leaving[name] = _Leaving(owned, stopped)

    async def _unlock_handed_over(self, conn: asyncpg.Connection) -> None:
        for name, leaving in list(self.leaving.items()):
            if leaving.stopped.done():
                del self.leaving[name]
                await conn.fetchval(sql.query("advisory_unlock"), CONSUMER_LOCK_CLASS, leaving.owned.lock_key)
                log.info("delivery: handed subscription %s over", name)

    async def _claim(self, conn: asyncpg.Connection, candidates: list[tuple[str, Subscription]], room: int) -> None:
        """Takes up to ``room`` of ``candidates`` (in order) that no relay holds, in one statement
        (ferry._claim_consumers), and starts a worker for each."""
        if room <= 0 or not candidates:
            return
        by_consumer = {sub.consumer: (name, sub) for name, sub in candidates}
        rows = await conn.fetch(sql.query("claim_consumers"), CONSUMER_LOCK_CLASS, list(by_consumer), room)
        for row in rows:
            name, sub = by_consumer[row["consumer"]]
            if row["epoch"] is None:
                log.info("delivery: subscription %s is still being recorded by its former owner; later", name)
                continue
            try:
                # The new ownership epoch fences off a former owner that has not noticed yet.
                worker = SubscriptionWorker(sub, self.ctx, epoch=row["epoch"])
            except ValueError as exc:  # e.g. a secret that is not whsec_<base64>
                log.error("delivery: cannot deliver subscription %s: %s", name, exc)
                await conn.fetchval(sql.query("advisory_unlock"), CONSUMER_LOCK_CLASS, row["lock_key"])
                continue
            task = asyncio.create_task(worker.run(), name=f"deliver {name}")
            self.owned[name] = _Owned(worker, task, row["lock_key"])
            log.info("delivery: now delivering subscription %s -> %s", name, _host(sub.url))

    async def _retire(self, conn: asyncpg.Connection, sub: Subscription) -> None:
        """Removes an old partition that drained after a change of partitions, once its worker (if
        this relay runs it) has stopped and recorded what it still had in flight."""
        if sub.unit in self.leaving:
            return  # retired once its hand-over is done: this session still holds its lock
        if sub.unit in self.owned:
            owned = self.owned.pop(sub.unit)
            await self._stop_worker(sub.unit, owned, graceful=True)
            key = owned.lock_key
        else:
            key = await conn.fetchval(sql.query("consumer_lock_key"), sub.consumer)
            if not await conn.fetchval(sql.query("try_advisory_lock"), CONSUMER_LOCK_CLASS, key):
                return  # its owner retires it
        try:
            await conn.execute(sql.query("drop_drained_consumer"), sub.consumer)
            log.info("delivery: partition %s drained after the change of partitions; removed", sub.unit)
        finally:
            await conn.fetchval(sql.query("advisory_unlock"), CONSUMER_LOCK_CLASS, key)

    def in_flight(self) -> dict[str, int]:
        """Events in requests in flight, per subscription this relay delivers (its partitions summed)."""
        return self._per_subscription(lambda w: w.in_flight)

    def _per_subscription(self, value: Callable[[SubscriptionWorker], int]) -> dict[str, int]:
        totals: dict[str, int] = {}
        for owned in self.owned.values():
            name = owned.worker.sub.name
            totals[name] = totals.get(name, 0) + value(owned.worker)
        return totals

    def _stats(self) -> dict[str, dict[str, Any]]:
        """What the relay's heartbeat row says of its subscriptions (ferry.subscription_status reads
        it; a subscription missing from a counter counts 0 there). Zeros are left out: every round
        rewrote them all, about 300 KB of JSON every 2 s for 3,000 idle subscriptions (outside probe)."""
        down = {o.worker.sub.name: o.worker.endpoint_down_since() for o in self.owned.values()}
        counters = {
            "in_flight": self.in_flight(),
            "delivered_1m": self._per_subscription(lambda w: w.delivered.last(60)),
            "failed_5m": self._per_subscription(lambda w: w.failed.last(300)),
            "attempts_5m": self._per_subscription(lambda w: w.failed.last(300) + w.delivered.last(300)),
        }
        stats: dict[str, dict[str, Any]] = {k: {n: v for n, v in c.items() if v} for k, c in counters.items()}
        stats["endpoint_down"] = {n: since.isoformat() for n, since in down.items() if since}
        return stats

    async def _release(self, conn: asyncpg.Connection, name: str, *, graceful: bool) -> None:
        owned = self.owned.pop(name)
        await self._stop_worker(name, owned, graceful)
        await conn.fetchval(sql.query("advisory_unlock"), CONSUMER_LOCK_CLASS, owned.lock_key)
        log.info("delivery: released subscription %s", name)

    async def _stop_worker(self, name: str, owned: _Owned, graceful: bool, grace: float | None = None) -> None:
        owned.worker.stop()
        wait = grace if grace is not None else self.settings.stop_grace
        if graceful and not owned.task.done():
            # Its own failure is reported below (a worker that failed with a statement's timeout
            # read as "did not finish": the real error was hidden).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(owned.task), wait)
            if not owned.task.done():
                log.warning("delivery: %s did not finish within %.0f s; cancelling", name, wait)
        owned.task.cancel()
        (result,) = await asyncio.gather(owned.task, return_exceptions=True)
        if isinstance(result, (TimeoutError, asyncpg.PostgresError, *CONNECTION_ERRORS)):
            log.error("delivery: worker for %s failed: %s; what it had not recorded is sent again",
                      name, db.describe(result))  # fmt: skip
        elif isinstance(result, Exception):
            log.error("delivery: worker for %s failed", name, exc_info=result)

    async def _release_all(self, conn: asyncpg.Connection, *, graceful: bool) -> None:
        """Stop every worker at once (each within its grace period, hand-overs under way included:
        stopping the relay keeps stop_grace, which its supervisor counts on), then give the locks back."""
        owned = await self._take_all()
        await asyncio.gather(*(self._stop_worker(name, o, graceful) for name, o in owned.items()))
        for name, o in owned.items():
            await conn.fetchval(sql.query("advisory_unlock"), CONSUMER_LOCK_CLASS, o.lock_key)
            log.info("delivery: released subscription %s", name)

    async def _abandon_all(self) -> None:
        """The locks are gone with the connection: stop every worker now."""
        for name, o in (await self._take_all()).items():
            await self._stop_worker(name, o, graceful=False)

    async def _take_all(self) -> dict[str, _Owned]:
        """Every worker this relay runs, hand-overs under way included (their waits end here)."""
        owned, self.owned = self.owned, {}
        leaving, self.leaving = self.leaving, {}
        for left in leaving.values():
            left.stopped.cancel()
        await asyncio.gather(*(left.stopped for left in leaving.values()), return_exceptions=True)
        return owned | {name: left.owned for name, left in leaving.items()}


def _host(url: str) -> str:
    scheme, host, port = endpoint_of(url)
    return f"{scheme}://{host_port(host, port)}"
