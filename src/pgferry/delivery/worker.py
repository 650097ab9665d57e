"""Delivering one subscription: new batches from the log, and parked retries.

Three units: this worker runs the loops (what to send, when, and the cursor); the
``Sender`` (sending.py) sends a round's events through the sink; the ``Bookkeeper``
(bookkeeping.py) turns the answers into attempts, parked and dead events and records
them with the cursor's move. Every sink goes through all three.

Two loops run side by side. The batch loop takes the subscription's next
log batch, sends it (up to ``max_in_flight`` requests at once), then in ONE
transaction records every attempt, parks failures in ferry.retries (or dead
letters them), and acknowledges the batch. A crash anywhere before that
commit re-sends the batch: at-least-once, with stable webhook-ids. The retry
loop sends parked events when they are due, with the same bookkeeping.

A request still unanswered once its batch got no answer for ``detach_after``
seconds (when the subscription's timeout is longer) no longer holds back its batch: its events
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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from pgferry import db, sql
from pgferry.aio import Wake, wait_for_event
from pgferry.delivery.bookkeeping import Bookkeeper, Books
from pgferry.delivery.context import (
    PIPELINE_DEPTH,
    DeliveryContext,
    Outcome,
)
from pgferry.delivery.health import Admission, Key
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.sending import Sender
from pgferry.delivery.sink import Sink
from pgferry.delivery.steps import Step, StepRefused

log = logging.getLogger(__name__)

#: The fewest events a range is sized for after a read the byte bound cut (see _batch_loop).
READ_SPAN_MIN = 32
#: ... and the most (the default of ferry.config.max_batch_events, when the relay sets none).
READ_SPAN_MAX = 5000
#: SQLSTATE of ferry.advance_consumer when another process moved the cursor.
CURSOR_MOVED = "PF001"
#: SQLSTATE of ferry._fence when another relay claimed the subscription (migration 0016).
OWNERSHIP_LOST = "PF002"
#: ferry.webhook_steps refused a step: the subscription's consumer is gone (it was removed)
REMOVED = "42704"
#: A worker that read events this recently is woken on every tick at once (LogWatch.notify).
HOT_SECONDS = 1.0


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
class _Acks:
    """Delivered batches whose cursor move and attempts ride along with the worker's next step."""

    start_tick: int
    end_tick: int
    attempts: list[tuple[Any, ...]]
    #: the last batch's part of a range read in parts (its end tick, its last id), kept with the
    #: cursor so that a worker starting over resumes after it (migration 0023)
    part: tuple[int, int] | None = None

    def add(self, flight: _Flight, books: Books) -> None:
        self.end_tick = flight.end_tick
        self.part = flight.part
        self.attempts.extend(books.attempts)

    def ack(
        self,
    ) -> tuple[int, int, list[tuple[int, int, int | None, float | None]], tuple[int, int] | None]:
        """The cursor move, the delivered attempts (event, attempt, status, latency) to record, and
        the part it ends with."""
        return self.start_tick, self.end_tick, [(x[1], x[2], x[3], x[7]) for x in self.attempts], self.part


@dataclass
class _Flight:
    """A batch read from the log and being sent."""

    start_tick: int
    end_tick: int
    task: asyncio.Task[Books]
    #: a part of a range read in parts: (the range's end tick, the part's last id)
    part: tuple[int, int] | None = None


class SubscriptionWorker:
    def __init__(self, sub: Subscription, ctx: DeliveryContext, *, epoch: int | None = None) -> None:
        self.ctx = ctx
        self.sub = sub
        #: the ownership epoch the relay claimed the subscription in: every read and recording
        #: checks it, so that a relay that lost the subscription stops (migration 0016)
        self.epoch = epoch
        self.sink: Sink = sink_for(sub, ctx)
        self.wake = Wake()
        self.stopping = asyncio.Event()
        #: records what rounds did; its counters are the worker's delivered and failed
        self.books = Bookkeeper(ctx, epoch)
        self.delivered = self.books.delivered
        self.failed = self.books.failed
        #: sends rounds of events through the sink; its answers to requests let go of come back here
        self.sender = Sender(sub, self.sink, ctx, self.books.probes, self._answered_late, self.stopping)
        #: requests let go of by their round, and the recording of their answers
        self.background = self.sender.background
        #: events parked as in flight whose answers are not recorded yet
        self.let_go = self.sender.let_go
        #: late answers waiting to be recorded, and the task recording them
        self._late: list[tuple[Sequence[OutEvent], HttpResult]] = []
        self._late_recorder: asyncio.Future[None] | None = None
        #: wakes the retry loop: stopping, or the endpoint answering again
        self.retry_wake = asyncio.Event()
        self.release_parked = False
        self.endpoint: Key | None = None
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
        #: the retry loop's last read filled half its byte bound or more: the next asks for its whole share
        self._retry_whole = False
        #: when a read last had events (time.monotonic()): a worker that had some within HOT_SECONDS
        #: is woken by the LogWatch on a tick at once, before it asks which streams moved (that
        #: round trip is then not on a busy subscription's latency)
        self.read_events_at = float("-inf")
        self._watch(sub)

    @property
    def hot(self) -> bool:
        """Whether a read had events within the last HOT_SECONDS."""
        return time.monotonic() - self.read_events_at < HOT_SECONDS

    @property
    def in_flight(self) -> int:
        """Events in requests in flight now (the relay's status and metrics)."""
        return self.sender.in_flight

    def _watch(self, sub: Subscription) -> None:
        """Follow the health of the subscription's endpoint (none for pg_net: each request has
        its own URL and timeout, as in pg_net)."""
        # Its host's health and its own: a 429 speaks for the subscription's URL alone (health.py).
        endpoint = (*self.sink.endpoint, sub.name) if self.sink.endpoint is not None else None
        if endpoint == self.endpoint:
            return
        if self.endpoint is not None:
            self.ctx.health.unwatch(self.endpoint, self._endpoint_recovered)
        self.endpoint = self.sender.endpoint = endpoint
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
        done_waiting = self.sub.waiting and not sub.waiting
        self.sub = sub
        if done_waiting:  # a new partition whose predecessors are gone: what it could not read, now
            self.wake.set()
            self.retry_wake.set()
        self.sink = sink_for(sub, self.ctx)
        self.sender.follow(sub, self.sink)
        self._watch(sub)

    def skip(self, from_tick: int, to_tick: int) -> bool:
        """Moves the idle batch loop over ``(from_tick, to_tick]``, a range that holds nothing for
        this subscription, without a read; False (nothing changed) unless it waits at ``from_tick``.
        The cursor itself moves with the pending acknowledgements; never back (``to_tick`` not
        after ``from_tick``: its events would be read and sent again)."""
        if to_tick <= from_tick or self.idle_at != from_tick or not self.settled.is_set():
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
            if exc.sqlstate == REMOVED:  # unsubscribed while its events were in hand: nothing to deliver them to
                log.info("subscription %s was removed; this relay stops delivering it", self.sub.name)
            elif exc.sqlstate == CURSOR_MOVED:  # stopping with batches it could not record
                log.warning("subscription %s: %s; what it delivered of them is counted in the gap (ferry.gaps)",
                            self.sub.name, exc.args[0])  # fmt: skip
            elif exc.sqlstate != OWNERSHIP_LOST:
                raise
            else:  # another relay delivers it now: what we had read and not recorded, it sends again
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
        whole = False  # the last read filled half its byte bound or more, and there is more (delivery.budget)
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
                        await self._record(books, advance=(flight.start_tick, flight.end_tick), part=flight.part)
                    if self.stopping.is_set() and not flights:
                        break
                    room = not self.stopping.is_set() and len(flights) < (1 if self.sub.ordered else PIPELINE_DEPTH)
                    # Read when there may be something new: the relay's LogWatch woke us
                    # (a tick on our streams, or its fallback poll), or the last read was
                    # cut short. Acknowledgements wait for the next read (or the LogWatch).
                    if room and (fresh or more or self.wake.is_set()):
                        self.wake.clear()
                        step = self.step_for(acks, peek=True, peek_after=ahead, resume=resume, span=span)
                        step.whole = whole
                        rows = await self.ctx.steps.step(step)
                        acks, fresh, more, whole = None, False, False, False
                        if rows:
                            flight, more, span, whole = self._take_off(step, rows)
                            # The batch is the flight's now: nothing here may hold it while the next
                            # read waits (for the read budget, which counts it as given back once sent).
                            del step, rows
                            flights.append(flight)
                            resume, ahead = flight.part, flight.end_tick
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

    def _take_off(self, step: Step, rows: list[asyncpg.Record]) -> tuple[_Flight, bool, int | None, bool]:
        """A read's batch on its way: the flight sending it, whether there is more to read, the
        events the next read's range is sized for, and whether the next read asks the read
        budget for its whole share (a backlog of large events)."""
        events = [OutEvent.from_batch_row(r) for r in rows if r["id"] is not None]
        if events:
            self.read_events_at = time.monotonic()
        blocked = {r["key"] for r in rows if r["blocked"]}
        task = asyncio.create_task(self._deliver_batch(events, blocked))
        self._release_when_sent(task, step.held)
        # A part of a range (the byte bound cut it inside a transaction) moves
        # no cursor: its parts are acknowledged as start -> start until the last.
        head = rows[0]
        resume = None if head["cut_after"] is None else (head["end_tick"], head["cut_after"])
        end = head["end_tick"] if resume is None else head["start_tick"]
        more = bool(resume is not None or head["more"])
        whole = more and step.bound is not None and 2 * step.held >= step.bound
        return _Flight(head["start_tick"], end, task, resume), more, self._next_span(events, step.held, cut=more), whole

    def _release_when_sent(self, task: asyncio.Future[Any], held: int) -> None:
        """Gives a read's bytes back to the relay's read budget once its events are sent (or
        the sending ends otherwise): not when the worker next looks at it, since it may be
        waiting on the budget itself then."""
        budget = self.ctx.budget
        if budget is not None and held:
            task.add_done_callback(lambda _: budget.release(held))

    def _next_span(self, events: Sequence[OutEvent], held: int, *, cut: bool) -> int | None:
        """Events the next read's range is sized for: after a read the byte bound cut (``held``,
        the bytes the read budget counted for its events, at least half the read's share), about
        twice as many as it held, since PostgreSQL builds every event of a range before the bound
        stops the read, and a 5,000-event range of 1 MB rows costs it 5 GB a read. None
        otherwise (max_batch_events)."""
        read_bytes = self.ctx.read_bytes
        if not cut or read_bytes is None or 2 * held < read_bytes:
            return None
        return min(max(2 * len(events), READ_SPAN_MIN), self.ctx.max_batch_events or READ_SPAN_MAX)

    async def _cursor_tick(self) -> int | None:
        async with self.ctx.pool.acquire() as conn:
            return await conn.fetchval(sql.query("consumer_tick"), self.sub.consumer)  # type: ignore[no-any-return]

    async def _deliver_batch(self, events: Sequence[OutEvent], blocked: set[str]) -> Books:
        events = await self.sink.ready(events)
        return await self._deliver_and_account(events, blocked, from_batch=True)

    async def _deliver_and_account(
        self, events: Sequence[OutEvent], blocked: set[str], *, from_batch: bool, probe: bool = False
    ) -> Books:
        """``probe``: the round is the endpoint's probe (one event; the worker reserved the turn)."""
        if not events:  # a batch with nothing for this subscription: only its range to acknowledge
            return self._account([], from_batch=from_batch)
        outcomes, recorded = await self.sender.deliver(events, blocked, probe)
        books = self._account(outcomes, from_batch=from_batch)
        books.recorded = recorded
        return books

    async def _wait(self, head: asyncio.Task[Books] | None, *, wake: bool) -> None:
        """Until the oldest batch in flight is done, or (``wake``) the LogWatch wakes us."""
        if wake:
            await self.wake.wait(head)
        else:
            assert head is not None  # not waking only while batches are in flight
            await asyncio.wait({head})

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
            # Requests let go of are still in flight: their answers are recorded when they come.
            # Those let go of before the fetch count too: an answer recorded while the fetch was
            # under way deletes the row the fetch may still return (sent again: a duplicate).
            in_flight = set(self.let_go)
            rows, next_at, held = await self._read_retries(probe)
            try:
                sent = await self._retry_round(rows, in_flight, probe)
            finally:
                del rows  # not held while the loop waits (for the read budget too)
                if self.ctx.budget is not None:
                    self.ctx.budget.release(held)
            if sent:
                continue
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

    async def _retry_round(self, rows: list[asyncpg.Record], in_flight: set[int], probe: bool) -> bool:
        """Sends and records the parked events ``rows`` but those still in flight; False when
        none was left to send."""
        in_flight |= self.let_go
        # With ordering on, a key whose earliest due event is still in flight waits whole: its
        # in-flight row is due once timeout_ms plus a margin has passed, and when its answer
        # was recorded later than that (a busy database), the events behind it went first.
        waiting = (
            {r["key"] for r in rows if r["id"] in in_flight and r["key"] is not None} if self.sub.ordered else set()
        )
        events = [OutEvent.from_row(r) for r in rows if r["id"] not in in_flight and r["key"] not in waiting]
        if not events:
            return False
        books = await self._deliver_and_account(events, set(), from_batch=False, probe=probe)
        await self._record(books, advance=None)
        return True

    async def _read_retries(self, probe: bool) -> tuple[list[asyncpg.Record], datetime | None, int]:
        """The parked events due now (``probe``: the one to probe the endpoint with), when the next
        is due if none is, and the bytes they hold in the relay's read budget (release them)."""
        sub, budget, bound = self.sub, self.ctx.budget, self.ctx.read_bytes
        reserved = 0
        if budget is not None and bound is not None and not probe:
            # Taken before a connection: a read waiting for room must not hold a connection that
            # the reads giving room back need.
            bound = reserved = await budget.acquire(bound, whole=self._retry_whole)
        try:
            async with self.ctx.pool.acquire() as conn:
                if probe:  # the due event with the fewest attempts: probes spread over the held events
                    rows = await conn.fetch(sql.query("retries_probe"), sub.name, sub.ordered, sub.part, sub.parts)
                else:
                    rows = await conn.fetch(sql.query("due_retries"), sub.name, sub.ordered,
                                            self.ctx.retry_fetch, bound, sub.part, sub.parts)  # fmt: skip
                next_at = None
                if not rows:
                    next_at = await conn.fetchval(
                        sql.query("next_retry_at"), sub.name, sub.ordered, sub.part, sub.parts
                    )
        except BaseException:
            if budget is not None:
                budget.settle(reserved, 0)
            raise
        held = budget.settle_rows(reserved, [rows])[0] if budget is not None and reserved else 0
        self._retry_whole = 2 * held >= reserved > 0  # like the batch reads' whole (delivery.budget)
        return rows, next_at, held

    async def _expire_held(self) -> None:
        async with self.ctx.pool.acquire() as conn:
            expired = await conn.fetchval(sql.query("retries_expire"), self.sub.name, self.sub.part, self.sub.parts)
        if expired:
            log.warning("subscription %s: %d held event(s) moved to dead letters (max_age passed)",
                        self.sub.name, expired)  # fmt: skip

    async def _answered_late(self, recorded: asyncio.Event, chunk: Sequence[OutEvent], result: HttpResult) -> None:
        """Records the answer to a request its round let go of, once the round's parking is
        committed. Answers that come while others are being recorded are recorded together, in
        one statement: under load many requests outlast their round at once, and a write for
        each added database work exactly when there was the least to spare."""
        await recorded.wait()
        self._late.append((chunk, result))
        if self._late_recorder is None or self._late_recorder.done():
            self._late_recorder = asyncio.ensure_future(self._record_late())
            self.background.add(self._late_recorder)
            self._late_recorder.add_done_callback(self.background.discard)
        await asyncio.shield(self._late_recorder)

    async def _record_late(self) -> None:
        while self._late:
            answers, self._late = self._late, []
            try:
                outcomes = [(e, result) for chunk, result in answers for e in chunk]
                await self._record(self._account(outcomes, from_batch=False), advance=None)
            except (asyncpg.PostgresError, *db.CONNECTION_ERRORS) as exc:
                if getattr(exc, "sqlstate", None) == REMOVED:  # nothing left to record them for
                    log.info("subscription %s was removed; %d late answer(s) not recorded", self.sub.name, len(answers))
                else:
                    # Still parked as in flight: they are sent again once that is due (at-least-once),
                    # by this worker's retry loop too, which skips events in self.let_go.
                    log.warning("subscription %s: could not record %d late answer(s) (%s); they will be sent "
                                "again", self.sub.name, len(answers), db.describe(exc))  # fmt: skip
            for chunk, _ in answers:
                self.let_go.difference_update(e.id for e in chunk)

    # -- bookkeeping -------------------------------------------------------

    def _account(self, outcomes: Sequence[Outcome], *, from_batch: bool) -> Books:
        return self.books.account(self.sub, self.sink, outcomes, from_batch=from_batch)

    async def _record(
        self, books: Books, *, advance: tuple[int, int] | None, part: tuple[int, int] | None = None
    ) -> None:
        """Records ``books`` (bookkeeping.py); a subscription its endpoint made gone stops, and the
        retry loop learns when newly parked events are due."""
        await self.books.record(self.sub, books, advance=advance, part=part)
        if books.gone is not None:
            self.stop()
        if books.park:
            self.retry_wake.set()
