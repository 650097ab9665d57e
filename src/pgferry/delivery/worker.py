"""Delivering one subscription: new batches from the log, and parked retries.

Two loops run side by side. The batch loop takes the subscription's next
log batch, sends it (up to ``max_in_flight`` requests at once), then in ONE
transaction records every attempt, parks failures in ferry.retries (or dead
letters them), and acknowledges the batch. A crash anywhere before that
commit re-sends the batch: at-least-once, with stable webhook-ids. The retry
loop sends parked events when they are due, with the same bookkeeping.

A request still unanswered after ``detach_after`` seconds (when the
subscription's timeout is longer) no longer holds back its batch: its events
are parked as in flight, due only after the request's timeout, the cursor
moves on, and the answer, when it comes, is recorded as a retry's would be.
One hanging request then costs its subscription a second, not its timeout.

Only a request that reached the wire can be in flight: one still waiting
for a connection (behind the endpoint's pool, or the in-flight limits) when
its round lets go is withdrawn, never sent, and its events are parked as due
now, so no later retry can race it (a race that once duplicated thousands of
events with 1,000 subscriptions sharing one endpoint).

When the endpoint is down (``delivery.health``), events are held (parked
without spending an attempt) instead of sent, one request at a time probes
the endpoint, and once it answers the held and parked events are released
at once.

With ``ordered`` on, events are spread over lanes by key and each lane sends
in id order; once an event of a key fails, the later events of that key in
the batch are parked behind it, and the retry loop only sends a key's parked
events in order, from its earliest.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from pgferry import db, sql
from pgferry.aio import wait_for_event
from pgferry.delivery.context import (
    IN_FLIGHT,
    PIPELINE_DEPTH,
    DeliveryContext,
    Held,
    InFlight,
    Outcome,
)
from pgferry.delivery.counters import RollingCounter
from pgferry.delivery.health import Admission, Endpoint
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.retry import judge
from pgferry.delivery.sink import Sink
from pgferry.delivery.steps import Step, StepRefused

log = logging.getLogger(__name__)

ATTEMPT_COLUMNS = (
    "subscription", "event_id", "attempt", "status", "error_class", "error", "response", "latency_ms", "created_at",
)  # fmt: skip

#: The fewest events a range is sized for after a read the byte bound cut (see _batch_loop).
READ_SPAN_MIN = 32
#: ... and the most (the default of ferry.config.max_batch_events, when the relay sets none).
READ_SPAN_MAX = 5000
#: SQLSTATE of ferry.advance_consumer when another process moved the cursor.
CURSOR_MOVED = "PF001"
#: SQLSTATE of ferry._fence when another relay claimed the subscription (migration 0016).
OWNERSHIP_LOST = "PF002"


#: What a parked in-flight event's row says (`pgferry trace` shows it as in flight).
_IN_FLIGHT_NOTE = "in flight: no answer yet when its batch was recorded; the answer is recorded when it comes"
#: An in-flight event is due again this long after its request's timeout, should the answer never be recorded.
IN_FLIGHT_MARGIN = timedelta(seconds=5)
#: Seconds between checks of held events against their max_age while the endpoint is down.
EXPIRE_EVERY = 10.0
#: What a probe turn given back unused reports (nothing was sent).
WITHDRAWN = HttpResult(None, "withdrawn", "not sent", None, 0.0)
#: The most a stopping worker waits to make its abandoned requests due at once.
ABANDON_TIMEOUT_S = 2.0


def sink_for(sub: Subscription, ctx: DeliveryContext) -> Sink:
    """The sink a subscription delivers through: by its kind, then by its URL's scheme."""
    # Each sink is imported when first used: a relay without broker subscriptions never loads their clients.
    if sub.kind == "pg_net":
        from pgferry.delivery.pg_net import PgNetSink  # noqa: PLC0415

        return PgNetSink(sub, ctx)
    scheme = sub.url.partition(":")[0].lower()
    if scheme == "nats":
        from pgferry.delivery.jetstream import JetStreamSink  # noqa: PLC0415

        return JetStreamSink(sub, ctx)
    if scheme == "redis":
        from pgferry.delivery.redis_streams import RedisStreamsSink  # noqa: PLC0415

        return RedisStreamsSink(sub, ctx)
    from pgferry.delivery.webhook import WebhookSink  # noqa: PLC0415

    return WebhookSink(sub, ctx)


@dataclass
class _Bookkeeping:
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)
    park: list[tuple[Any, ...]] = field(default_factory=list)
    bury: list[tuple[Any, ...]] = field(default_factory=list)
    responses: list[tuple[Any, ...]] = field(default_factory=list)  # net._http_response rows (pg_net API)
    gone: str | None = None
    #: an attempt failed on the way to a delivery (a try on a kept-alive connection the server closed)
    failed_tries: bool = False
    #: set once these books are committed; answers to requests let go of wait for it
    recorded: asyncio.Event | None = None

    @property
    def all_delivered(self) -> bool:
        return not (self.park or self.bury or self.responses or self.gone or self.failed_tries)


@dataclass
class _Acks:
    """Delivered batches whose cursor move and attempts ride along with the worker's next step."""

    start_tick: int
    end_tick: int
    attempts: list[tuple[Any, ...]]

    def add(self, flight: _Flight, books: _Bookkeeping) -> None:
        self.end_tick = flight.end_tick
        self.attempts.extend(books.attempts)

    def ack(self) -> tuple[int, int, list[tuple[int, int, int | None, float | None]]]:
        """The cursor move and the delivered attempts (event, attempt, status, latency) to record."""
        return self.start_tick, self.end_tick, [(x[1], x[2], x[3], x[7]) for x in self.attempts]


@dataclass
class _Sending:
    """The requests of one delivery round, so that the round can let go of slow ones."""

    outcomes: list[Outcome] = field(default_factory=list)
    #: chunks whose requests reached the wire and are unanswered, by id() of the chunk
    in_flight: dict[int, Sequence[OutEvent]] = field(default_factory=dict)
    let_go: bool = False
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    #: the endpoint admission the round already holds (its probe), else None: asked per request
    admission: Admission | None = None


@dataclass
class _Flight:
    """A batch read from the log and being sent."""

    start_tick: int
    end_tick: int
    task: asyncio.Task[_Bookkeeping]


class SubscriptionWorker:
    def __init__(self, sub: Subscription, ctx: DeliveryContext, *, epoch: int | None = None) -> None:
        self.ctx = ctx
        self.sub = sub
        #: the ownership epoch the relay claimed the subscription in: every read and recording
        #: checks it, so that a relay that lost the subscription stops (migration 0016)
        self.epoch = epoch
        self.sink: Sink = sink_for(sub, ctx)
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.in_flight = 0
        self.limit = asyncio.Semaphore(sub.max_in_flight)
        self.delivered = RollingCounter()
        self.failed = RollingCounter()
        #: requests let go of by their round, and the recording of their answers
        self.background: set[asyncio.Future[Any]] = set()
        #: events parked as in flight whose answers are not recorded yet
        self.let_go: set[int] = set()
        #: wakes the retry loop: stopping, or the endpoint answering again
        self.retry_wake = asyncio.Event()
        self.release_parked = False
        #: events in requests sent as probes of a down endpoint, until their outcome is judged
        self.probes: set[int] = set()
        self.endpoint: Endpoint | None = None
        #: the tick the batch loop has read up to while it waits with nothing to do (the relay's
        #: LogWatch moves it over ranges holding nothing for this subscription), else None
        self.idle_at: int | None = None
        #: acknowledgements held while idle (delivered batches, ranges skipped): they ride along
        #: with the next read, or the LogWatch records them with every idle worker's, in one statement
        self.pending: _Acks | None = None
        #: cleared while the LogWatch records ``pending``: the batch loop waits for it before reading
        self.settled = asyncio.Event()
        self.settled.set()
        #: set when the batch loop must read again from the consumer's cursor
        self.start_over = False
        #: whether the retry loop waits for its next parked event (the LogWatch wakes it if one is due)
        self.retries_idle = False
        self._watch(sub)

    def _watch(self, sub: Subscription) -> None:
        """Follow the health of the subscription's endpoint (none for pg_net: each request has
        its own URL and timeout, as in pg_net)."""
        endpoint = self.sink.endpoint
        if endpoint == self.endpoint:
            return
        if self.endpoint is not None:
            self.ctx.health.unwatch(self.endpoint, self._endpoint_recovered)
        self.endpoint = endpoint
        if endpoint is not None:
            self.ctx.health.watch(endpoint, self._endpoint_recovered)

    def endpoint_down_since(self) -> datetime | None:
        """Since when the subscription's endpoint is down (its events held), or None."""
        return self.ctx.health.down_since(self.endpoint) if self.endpoint is not None else None

    def _endpoint_recovered(self) -> None:
        self.release_parked = True
        self.retry_wake.set()

    def update(self, sub: Subscription) -> None:
        """New settings take effect with the next request; the owning relay notices a change
        on its next round (every claim_interval seconds)."""
        if sub.max_in_flight != self.sub.max_in_flight:
            self.limit = asyncio.Semaphore(sub.max_in_flight)
        done_waiting = self.sub.waiting and not sub.waiting
        self.sub = sub
        if done_waiting:  # a new partition whose predecessors are gone: what it could not read, now
            self.wake.set()
            self.retry_wake.set()
        self.sink = sink_for(sub, self.ctx)
        self._watch(sub)

    def skip(self, from_tick: int, to_tick: int) -> bool:
        """Moves the idle batch loop over ``(from_tick, to_tick]``, a range that holds nothing for
        this subscription, without a read; False (nothing changed) unless it waits at ``from_tick``.
        The cursor itself moves with the pending acknowledgements."""
        if self.idle_at != from_tick or not self.settled.is_set():
            return False
        if self.pending is None:
            self.pending = _Acks(from_tick, to_tick, [])
        elif self.pending.end_tick == from_tick:
            self.pending.end_tick = to_tick
        else:
            return False
        self.idle_at = to_tick
        return True

    def take_pending(self) -> Step | None:
        """The idle worker's pending acknowledgements as a step, handed to the LogWatch, which sends
        it and then sets ``settled``; the batch loop does not read until then."""
        if self.pending is None or self.idle_at is None:
            return None
        pending, self.pending = self.pending, None
        self.settled.clear()
        return self.step_for(pending, peek=False, peek_after=None)

    def step_for(
        self,
        acks: _Acks | None,
        *,
        peek: bool,
        peek_after: int | None,
        resume: tuple[int, int] | None = None,
        span: int | None = None,
    ) -> Step:
        """A step of this subscription: acknowledge ``acks``, and (``peek``) read after ``peek_after``
        (``resume``: the rest of a range read in parts; ``span``: the events its range is sized for)."""
        sub = self.sub
        ack = acks.ack() if acks else None
        return Step(sub.name, sub.consumer, self.epoch, sub.ordered, ack, peek, peek_after, resume, span)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.retry_wake.set()

    async def run(self) -> None:
        loops = [asyncio.create_task(self._batch_loop()), asyncio.create_task(self._retry_loop())]
        try:
            await asyncio.gather(*loops)
            # Stopping: requests let go of may still be answered and recorded (the owner
            # cancels us after its grace period).
            while self.background:
                await asyncio.gather(*self.background, return_exceptions=True)
        except (asyncpg.PostgresError, StepRefused) as exc:
            if exc.sqlstate != OWNERSHIP_LOST:
                raise
            # Another relay delivers it now: what we had read and not recorded, it sends again.
            log.warning("subscription %s: %s; this relay stops delivering it", self.sub.name, exc.args[0])
        finally:
            for task in [*loops, *self.background]:
                task.cancel()
            await asyncio.gather(*loops, *self.background, return_exceptions=True)
            await self._abandon_let_go()
            if self.endpoint is not None:
                self.ctx.health.unwatch(self.endpoint, self._endpoint_recovered)

    async def _abandon_let_go(self) -> None:
        """Requests let go of and now abandoned: make their parked events due at once, so whoever
        delivers next sends them again now rather than after their timeout."""
        if not self.let_go:
            return
        try:
            async with asyncio.timeout(ABANDON_TIMEOUT_S), self.ctx.pool.acquire() as conn:
                await conn.execute(sql.query("retry_in_flight_now"), self.sub.name, sorted(self.let_go))
        except (TimeoutError, asyncpg.PostgresError, *db.CONNECTION_ERRORS) as exc:
            log.warning("subscription %s: %d abandoned request(s) will be sent again after their timeout (%s)",
                        self.sub.name, len(self.let_go), db.describe(exc))  # fmt: skip
        self.let_go.clear()

    # -- loops -------------------------------------------------------------

    async def _batch_loop(self) -> None:
        """Reads batches ahead while earlier ones are being sent; moves the cursor in order.

        Up to PIPELINE_DEPTH batches are in flight (one for an ordered
        subscription: a later batch must see which keys an earlier one
        parked). Fully delivered batches are acknowledged in the call that
        reads the next batch; a batch with failures is recorded in its own
        transaction, after the batches before it.
        """
        flights: deque[_Flight] = deque()
        acks: _Acks | None = None
        ahead: int | None = None  # end tick of the newest batch read; None: start at the consumer's cursor
        fresh = True  # nothing read yet (or starting over): read at once
        more = False  # the last read stopped short of the newest tick (batch size or byte limit)
        resume: tuple[int, int] | None = None  # a range read in parts: its end tick, the last id read
        span: int | None = None  # events the next read's range is sized for (None: max_batch_events)
        try:
            while True:
                try:
                    if self.idle_at is not None:  # woken: where the LogWatch moved us meanwhile
                        if self.idle_at != ahead:  # moved over empty ranges: no range is half read
                            resume, span = None, None
                        ahead, self.idle_at = self.idle_at, None
                        acks, self.pending = self.pending, None
                    await self.settled.wait()
                    if self.start_over:
                        self.start_over = False
                        acks, ahead, fresh, resume, span = None, None, True, None, None
                    while flights and flights[0].task.done():
                        flight = flights.popleft()
                        books = flight.task.result()
                        if books.all_delivered:
                            if acks is None:
                                acks = _Acks(flight.start_tick, flight.end_tick, [])
                            acks.add(flight, books)
                            continue
                        if acks is not None:
                            await self._step(acks, peek_after=None, peek=False)
                            acks = None
                        await self._record(books, advance=(flight.start_tick, flight.end_tick))
                    if self.stopping.is_set() and not flights:
                        break
                    room = not self.stopping.is_set() and len(flights) < (1 if self.sub.ordered else PIPELINE_DEPTH)
                    # Read when there may be something new: the relay's LogWatch woke us
                    # (a tick on our streams, or its fallback poll), or the last read was
                    # cut short. Acknowledgements wait for the next read (or the LogWatch).
                    if room and (fresh or more or self.wake.is_set()):
                        self.wake.clear()
                        rows = await self._step(acks, peek_after=ahead, peek=True, resume=resume, span=span)
                        acks, fresh, more = None, False, False
                        if rows:
                            events = [OutEvent.from_row(r) for r in rows if r["id"] is not None]
                            blocked = {r["key"] for r in rows if r["blocked"]}
                            task = asyncio.create_task(self._deliver_batch(events, blocked))
                            # A part of a range (the byte bound cut it inside a transaction) moves
                            # no cursor: its parts are acknowledged as start -> start until the last.
                            head = rows[0]
                            resume = None if head["cut_after"] is None else (head["end_tick"], head["cut_after"])
                            ahead = head["end_tick"] if resume is None else head["start_tick"]
                            flights.append(_Flight(head["start_tick"], ahead, task))
                            more = resume is not None or head["more"]
                            span = self._next_span(events, cut=resume is not None or head["more"])
                            continue
                        if ahead is None:  # nothing new since the cursor: learn where it is
                            ahead = await self._cursor_tick()
                    if room and not flights and self.idle_at is None:
                        # Nothing to do: the LogWatch may move us over empty ranges, and records
                        # what we acknowledge with every idle subscription's, in one statement.
                        self.idle_at, self.pending = ahead, acks
                        if acks is not None:
                            acks = None
                            self.ctx.acks_waiting.set()
                    await self._wait(flights[0].task if flights else None, wake=room)
                except (asyncpg.PostgresError, StepRefused) as exc:
                    if exc.sqlstate != CURSOR_MOVED:
                        raise
                    # Another relay delivered this subscription for a moment: what it
                    # acknowledged is done; start over from where the cursor is now.
                    log.warning("subscription %s: %s; reading again from its cursor", self.sub.name, exc)
                    for flight in flights:
                        flight.task.cancel()
                    await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
                    flights.clear()
                    acks, ahead, fresh, resume, span = None, None, True, None, None
        finally:
            for flight in flights:
                flight.task.cancel()
            if acks is None and self.settled.is_set():
                acks, self.pending = self.pending, None
            if acks is not None:  # delivered batches not recorded yet: record them now, not after a restart
                await self._step(acks, peek_after=None, peek=False)

    async def _step(
        self,
        acks: _Acks | None,
        *,
        peek_after: int | None,
        peek: bool,
        resume: tuple[int, int] | None = None,
        span: int | None = None,
    ) -> list[asyncpg.Record]:
        step = self.step_for(acks, peek=peek, peek_after=peek_after, resume=resume, span=span)
        return await self.ctx.steps.step(step)

    def _next_span(self, events: Sequence[OutEvent], *, cut: bool) -> int | None:
        """Events the next read's range is sized for: after a read the byte bound cut (payloads
        at least half the read's share), about twice as many as it held, since PostgreSQL builds
        every event of a range before the bound stops the read, and a 5,000-event range of 1 MB
        rows costs it 5 GB a read. None otherwise (max_batch_events)."""
        read_bytes = self.ctx.read_bytes
        if not cut or read_bytes is None or 2 * sum(len(e.payload) for e in events) < read_bytes:
            return None
        return min(max(2 * len(events), READ_SPAN_MIN), self.ctx.max_batch_events or READ_SPAN_MAX)

    async def _cursor_tick(self) -> int | None:
        async with self.ctx.pool.acquire() as conn:
            return await conn.fetchval(sql.query("consumer_tick"), self.sub.consumer)  # type: ignore[no-any-return]

    async def _deliver_batch(self, events: Sequence[OutEvent], blocked: set[str]) -> _Bookkeeping:
        events = await self.sink.ready(events)
        return await self._deliver_and_account(events, blocked, from_batch=True)

    async def _deliver_and_account(
        self, events: Sequence[OutEvent], blocked: set[str], *, from_batch: bool, probe: bool = False
    ) -> _Bookkeeping:
        """``probe``: the round is the endpoint's probe (one event; the worker reserved the turn)."""
        if not events:  # a batch with nothing for this subscription: only its range to acknowledge
            return self._account([], from_batch=from_batch)
        outcomes, recorded = await self._deliver(events, blocked, probe)
        books = self._account(outcomes, from_batch=from_batch)
        books.recorded = recorded
        return books

    async def _wait(self, head: asyncio.Task[_Bookkeeping] | None, *, wake: bool) -> None:
        """Until the oldest batch in flight is done, or (``wake``) the LogWatch wakes us."""
        waiters: set[asyncio.Future[Any]] = set() if head is None else {head}
        waker = asyncio.ensure_future(self.wake.wait()) if wake else None
        if waker is not None:
            waiters.add(waker)
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if waker is not None:
                waker.cancel()

    async def _retry_loop(self) -> None:
        expired_at = 0.0  # when held events were last checked against max_age
        while not self.stopping.is_set():
            self.retry_wake.clear()
            sub = self.sub
            if sub.waiting:  # a new partition: the old ones retry parked events until they are gone
                await wait_for_event(self.retry_wake, self.ctx.poll_interval)
                continue
            if self.release_parked:
                self.release_parked = False
                async with self.ctx.pool.acquire() as conn:
                    await conn.execute(sql.query("retries_release"), sub.name, sub.part, sub.parts)
            probe = False
            if self.endpoint is not None and self.ctx.health.is_down(self.endpoint):
                # Its events wait (held), but not beyond max_age; one request a second probes it.
                if time.monotonic() - expired_at >= EXPIRE_EVERY:
                    expired_at = time.monotonic()
                    await self._expire_held()
                if self.ctx.health.admit(self.endpoint) is not Admission.PROBE:
                    await wait_for_event(self.retry_wake, self.ctx.health.probe_wait(self.endpoint) or 0.0)
                    continue
                probe = True
            async with self.ctx.pool.acquire() as conn:
                if probe:  # the due event with the fewest attempts: probes spread over the held events
                    rows = await conn.fetch(sql.query("retries_probe"), sub.name, sub.ordered, sub.part, sub.parts)
                else:
                    rows = await conn.fetch(sql.query("due_retries"), sub.name, sub.ordered,
                                            self.ctx.retry_fetch, self.ctx.read_bytes, sub.part, sub.parts)  # fmt: skip
                next_at = None
                if not rows:
                    next_at = await conn.fetchval(
                        sql.query("next_retry_at"), sub.name, sub.ordered, sub.part, sub.parts
                    )
            # Requests let go of are still in flight: their answers are recorded when they come.
            events = [OutEvent.from_row(r) for r in rows if r["id"] not in self.let_go]
            if not events:
                if probe and self.endpoint is not None:  # nothing of ours to probe with: another worker may
                    self.ctx.health.report(self.endpoint, WITHDRAWN, Admission.PROBE)
                # Until the next parked event is due; events parked by someone else (a dead
                # letter replayed) are found by the LogWatch's fallback poll, which wakes us.
                self.retries_idle = True
                try:
                    if next_at is None:
                        await self.retry_wake.wait()
                    else:
                        await wait_for_event(self.retry_wake, max(0.0, (next_at - datetime.now(UTC)).total_seconds()))
                finally:
                    self.retries_idle = False
                continue
            books = await self._deliver_and_account(events, set(), from_batch=False, probe=probe)
            await self._record(books, advance=None)

    async def _expire_held(self) -> None:
        async with self.ctx.pool.acquire() as conn:
            expired = await conn.fetchval(sql.query("retries_expire"), self.sub.name, self.sub.part, self.sub.parts)
        if expired:
            log.warning("subscription %s: %d held event(s) moved to dead letters (max_age passed)",
                        self.sub.name, expired)  # fmt: skip

    # -- sending -----------------------------------------------------------

    async def _send(
        self, chunk: Sequence[OutEvent], on_wire: Callable[[], bool] | None = None, admission: Admission | None = None
    ) -> HttpResult | Held:
        sub, sink = self.sub, self.sink
        prepared = sink.prepare(chunk)
        if isinstance(prepared, HttpResult):
            return prepared
        endpoint = self.endpoint
        if endpoint is None:
            admission = Admission.SEND
        elif admission is None:
            admission = self.ctx.health.admit(endpoint)
            if admission is Admission.HOLD:
                return Held(self.ctx.health.down_note(endpoint))
        if admission is Admission.PROBE:
            self.probes.update(e.id for e in chunk)
        gate = on_wire
        held = False
        if endpoint is not None and admission is Admission.SEND:

            def gate() -> bool:  # the endpoint may have gone down while this waited for a slot
                nonlocal held
                if self.ctx.health.is_down(endpoint):
                    held = True
                    return False
                return on_wire() if on_wire is not None else True

        # The subscription's limit covers the batch and the retry loop together.
        async with self.limit, self.ctx.global_limit:
            self.in_flight += len(chunk)
            try:
                result = await sink.send(chunk, prepared, gate, fresh=admission is Admission.PROBE)
            except Exception as exc:  # a bug of ours must cost a retry, not the worker
                log.exception("subscription %s: unexpected error sending events %s", sub.name, [e.id for e in chunk])
                result = HttpResult(None, "internal", f"pgferry internal error: {exc!r}", None, 0.0)
            finally:
                self.in_flight -= len(chunk)
        if result.error_class == "withdrawn" and admission is Admission.PROBE:
            self.probes.difference_update(e.id for e in chunk)  # never sent: nothing to judge
        if endpoint is not None:
            if held:
                return Held(self.ctx.health.down_note(endpoint))
            if self.ctx.health.report(endpoint, result, admission):
                sink.endpoint_down()
        return result

    async def _deliver(
        self, events: Sequence[OutEvent], blocked: set[str], probe: bool = False
    ) -> tuple[list[Outcome], asyncio.Event | None]:
        """Sends ``events``; returns their outcomes, and (when the round let go of slow
        requests) the event to set once those outcomes are committed."""
        sending = _Sending(admission=Admission.PROBE if probe else None)
        work = asyncio.ensure_future(self._send_all(events, blocked, sending))
        patience = self.ctx.detach_after if self.sink.may_let_go(self.ctx.detach_after) else None
        try:
            await asyncio.wait({work}, timeout=patience)
        except BaseException:
            work.cancel()
            raise
        if work.done() or not sending.in_flight:
            await work
            return sending.outcomes, None
        # Let go: what was answered counts, requests in flight are parked as in flight,
        # events not sent yet are parked as due now; the round's tasks stop after their
        # current request, whose answer _answered_late records.
        sending.let_go = True
        self.background.add(work)
        work.add_done_callback(self.background.discard)
        in_flight = {e.id for chunk in sending.in_flight.values() for e in chunk}
        self.let_go |= in_flight
        settled = {e.id for e, _ in sending.outcomes}
        outcomes = list(sending.outcomes)
        for e in events:
            if e.id in in_flight:
                outcomes.append((e, IN_FLIGHT))
            elif e.id not in settled:
                outcomes.append((e, None))
        log.info(
            "subscription %s: %d event(s) in requests unanswered after %.1f s; moving on, their answers are "
            "recorded when they come", self.sub.name, len(in_flight), patience,
        )  # fmt: skip
        return outcomes, sending.recorded

    async def _send_all(self, events: Sequence[OutEvent], blocked: set[str], sending: _Sending) -> None:
        sub = self.sub
        batch_size = self.sink.batch_size
        if not sub.ordered:
            chunks = deque(events[i : i + batch_size] for i in range(0, len(events), batch_size))

            async def drain() -> None:
                while chunks and not sending.let_go:
                    await self._send_in(sending, chunks.popleft())

            await asyncio.gather(*(drain() for _ in range(min(sub.max_in_flight, len(chunks)))))
            return

        n_lanes = max(1, min(sub.max_in_flight, len(events)))
        lanes: list[list[OutEvent]] = [[] for _ in range(n_lanes)]
        for e in events:
            lane = zlib.crc32(e.key.encode()) if e.key is not None else e.id
            lanes[lane % n_lanes].append(e)

        async def run_lane(lane_events: list[OutEvent]) -> None:
            chunk: list[OutEvent] = []

            async def flush() -> None:
                result = await self._send_in(sending, list(chunk))
                if result is not None and not result.ok:
                    blocked.update(e.key for e in chunk if e.key is not None)
                chunk.clear()

            for e in lane_events:
                if sending.let_go:
                    return
                if e.key is not None and e.key in blocked:
                    sending.outcomes.append((e, None))
                    continue
                chunk.append(e)
                if len(chunk) >= batch_size:
                    await flush()
            if chunk and not sending.let_go:
                await flush()

        await asyncio.gather(*(run_lane(lane) for lane in lanes if lane))

    async def _send_in(self, sending: _Sending, chunk: Sequence[OutEvent]) -> HttpResult | Held | None:
        """Sends ``chunk`` as part of ``sending``; None when the round let go of it meanwhile."""
        key = id(chunk)

        def on_wire() -> bool:  # the last moment a request can be taken back
            if sending.let_go:
                return False
            sending.in_flight[key] = chunk
            return True

        try:
            result = await self._send(chunk, on_wire, sending.admission)
        finally:
            wired = sending.in_flight.pop(key, None) is not None
        if sending.let_go:
            # Its events were parked when the round let go: as in flight if the request was
            # on the wire (its answer is recorded now), as due now if it was not.
            if wired and isinstance(result, HttpResult):
                task = asyncio.create_task(self._answered_late(sending.recorded, chunk, result))
                self.background.add(task)
                task.add_done_callback(self.background.discard)
            return None
        sending.outcomes.extend((e, result) for e in chunk)
        return result

    async def _answered_late(self, recorded: asyncio.Event, chunk: Sequence[OutEvent], result: HttpResult) -> None:
        """Records the answer to a request its round let go of, once the round's parking is committed."""
        await recorded.wait()
        try:
            await self._record(self._account([(e, result) for e in chunk], from_batch=False), advance=None)
            self.let_go.difference_update(e.id for e in chunk)
        except (asyncpg.PostgresError, *db.CONNECTION_ERRORS) as exc:
            # Still parked as in flight: it is sent again once that is due (at-least-once).
            log.warning("subscription %s: could not record a late answer (%s); it will be sent again",
                        self.sub.name, db.describe(exc))  # fmt: skip

    # -- bookkeeping -------------------------------------------------------

    def _account(self, outcomes: Sequence[Outcome], *, from_batch: bool) -> _Bookkeeping:
        sub = self.sub
        if self.ctx.observe is not None:
            self.ctx.observe(sub.name, outcomes, from_batch)
        now = datetime.now(UTC)
        books = _Bookkeeping()
        for event, result in outcomes:
            if result is None:
                books.park.append(_parked(event, event.attempts, now, now, None))
                continue
            if isinstance(result, Held):  # not sent: no attempt spent, due once the endpoint answers
                books.park.append(_parked(event, event.attempts, event.first_failed_at or now, now, None,
                                          error=result.note))  # fmt: skip
                continue
            if isinstance(result, InFlight):
                due = now + timedelta(milliseconds=sub.timeout_ms) + IN_FLIGHT_MARGIN
                books.park.append(_parked(event, event.attempts, event.first_failed_at or now, due, None,
                                          error=_IN_FLIGHT_NOTE))  # fmt: skip
                continue
            attempt = event.attempts
            for earlier in result.earlier:  # tries that reached the wire before this one
                attempt += 1
                books.failed_tries = True
                books.attempts.append(
                    (sub.name, event.id, attempt, earlier.status, earlier.error_class, earlier.error,
                     earlier.response, earlier.latency_ms, now)
                )  # fmt: skip
            attempt += 1
            books.attempts.append(
                (sub.name, event.id, attempt, result.status, result.error_class, result.error,
                 result.response, result.latency_ms, now)
            )  # fmt: skip
            if self.sink.delivered(result):
                books.delivered.append(event.id)
                self._respond(books, event, result)
                continue
            gone = self.sink.gone(result)
            if gone is not None:
                books.gone = f"{gone} at {now:%Y-%m-%d %H:%M:%S}Z; resume the subscription to retry"
            first_failed = event.first_failed_at or now
            probe = event.id in self.probes
            if probe:
                self.probes.discard(event.id)
            verdict = judge(sub, result, attempt, first_failed, now, probe=probe)
            if verdict.dead:
                books.bury.append(_buried(event, attempt, first_failed, result))
                self._respond(books, event, result)
            else:
                books.park.append(_parked(event, attempt, first_failed, verdict.next_attempt_at or now, result))
        self.delivered.add(len(books.delivered))
        self.failed.add(len(books.attempts) - len(books.delivered))
        return books

    def _respond(self, books: _Bookkeeping, event: OutEvent, result: HttpResult) -> None:
        row = self.sink.response_row(event, result)
        if row is not None:
            books.responses.append(row)

    async def _record(self, books: _Bookkeeping, *, advance: tuple[int, int] | None) -> None:
        """Records attempts, parks and buries failures, and moves the cursor over the batch
        (``advance``: from tick, to tick; None for parked retries), in one transaction."""
        sub = self.sub
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if self.epoch is not None:  # still ours? (holds the consumer row against a new owner's claim)
                await conn.execute(sql.query("fence"), sub.consumer, self.epoch)
            if books.attempts:
                await conn.copy_records_to_table(
                    "attempts", schema_name="ferry", columns=ATTEMPT_COLUMNS, records=books.attempts
                )
            if books.park:
                await conn.execute(sql.query("park"), sub.name, *zip(*books.park, strict=True))
            if books.bury:
                await conn.execute(sql.query("bury"), sub.name, *zip(*books.bury, strict=True))
            if books.responses:
                await conn.execute(sql.query("record_net_responses"), *zip(*books.responses, strict=True))
                await conn.execute(sql.query("net_requests_done"), [row[0] for row in books.responses])
            if advance is None:
                done = books.delivered + [row[0] for row in books.bury]
                if done:
                    await conn.execute(sql.query("unpark"), sub.name, done)
            if books.gone is not None:
                log.warning("subscription %s disabled: %s", sub.name, books.gone)
                await conn.execute(sql.query("disable_subscription"), sub.name, books.gone)
                self.stop()
            if advance is not None:
                await conn.execute(sql.query("advance_consumer"), sub.consumer, *advance)
        if books.recorded is not None:
            books.recorded.set()
        if books.park:  # the retry loop learns when they are due
            self.retry_wake.set()
        if books.bury:
            log.warning("subscription %s: %d event(s) moved to dead letters", sub.name, len(books.bury))


def _parked(
    event: OutEvent, attempts: int, first_failed: datetime, next_at: datetime, result: HttpResult | None,
    *, error: str | None = None,
) -> tuple[Any, ...]:  # fmt: skip
    return (
        event.id, event.stream, event.key, event.payload, event.headers, event.created_at, attempts,
        first_failed, next_at,
        result.status if result else None, result.error if result else error, result.response if result else None,
    )  # fmt: skip


def _buried(event: OutEvent, attempts: int, first_failed: datetime, result: HttpResult) -> tuple[Any, ...]:
    return (
        event.id, event.stream, event.key, event.payload, event.headers, event.created_at, attempts,
        first_failed, result.status, result.error, result.response,
    )  # fmt: skip
