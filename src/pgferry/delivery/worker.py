"""Delivering one subscription: new batches from the log, and parked retries.

Two loops run side by side. The batch loop takes the subscription's next
log batch, sends it (up to ``max_in_flight`` requests at once), then in ONE
transaction records every attempt, parks failures in ferry.retries (or dead
letters them), and acknowledges the batch. A crash anywhere before that
commit re-sends the batch: at-least-once, with stable webhook-ids. The retry
loop sends parked events when they are due, with the same bookkeeping.

With ``ordered`` on, events are spread over lanes by key and each lane sends
in id order; once an event of a key fails, the later events of that key in
the batch are parked behind it, and the retry loop only ever sends the
earliest parked event of a key.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from pgferry import sql
from pgferry.aio import wait_for_event
from pgferry.delivery import pg_net, request
from pgferry.delivery.counters import RollingCounter
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpResult, HttpSender
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.retry import judge
from pgferry.delivery.signing import Signer

log = logging.getLogger(__name__)

ATTEMPT_COLUMNS = (
    "subscription", "event_id", "attempt", "status", "error_class", "error", "response", "latency_ms", "created_at",
)  # fmt: skip

#: Batches in flight at once: one being sent while the next is read. A third
#: made batch-100 throughput ~10% higher (60K vs 54K events/s) but the
#: single-row p99 worse (median of runs 56 vs 37 ms): batches queue behind
#: each other for the in-flight slots (docs/benchmarks.md).
PIPELINE_DEPTH = 2
#: SQLSTATE of ferry.advance_consumer when another process moved the cursor.
CURSOR_MOVED = "PF001"

Outcome = tuple[OutEvent, HttpResult | None]  # None: not sent, waiting behind an earlier event of its key


@dataclass
class DeliveryContext:
    """What every worker of a relay shares."""

    pool: asyncpg.Pool
    sender: HttpSender  # pg_net requests: any method, redirects, whole responses
    webhooks: FastSender  # webhook POSTs, the hot path
    global_limit: asyncio.Semaphore
    max_body_bytes: int = 1 << 20
    max_batch_events: int | None = None
    retry_fetch: int = 1000
    poll_interval: float = 1.0
    #: metrics hook: (subscription, outcomes, from a log batch?) after each round
    observe: Callable[[str, Sequence[Outcome], bool], None] | None = None


@dataclass
class _Bookkeeping:
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)
    park: list[tuple[Any, ...]] = field(default_factory=list)
    bury: list[tuple[Any, ...]] = field(default_factory=list)
    responses: list[tuple[Any, ...]] = field(default_factory=list)  # net._http_response rows (pg_net API)
    gone: str | None = None

    @property
    def all_delivered(self) -> bool:
        return not (self.park or self.bury or self.responses or self.gone)


@dataclass
class _Acks:
    """Delivered batches whose cursor move and attempts ride along with the next webhook_step call."""

    start_tick: int
    end_tick: int
    attempts: list[tuple[Any, ...]]

    def add(self, flight: _Flight, books: _Bookkeeping) -> None:
        self.end_tick = flight.end_tick
        self.attempts.extend(books.attempts)

    def args(self) -> tuple[Any, ...]:
        a = self.attempts
        return (
            self.start_tick,
            self.end_tick,
            [x[1] for x in a],
            [x[2] for x in a],
            [x[3] for x in a],
            [x[7] for x in a],
        )


NO_ACKS: tuple[None, ...] = (None,) * 6


@dataclass
class _Flight:
    """A batch read from the log and being sent."""

    start_tick: int
    end_tick: int
    task: asyncio.Task[_Bookkeeping]


class SubscriptionWorker:
    def __init__(self, sub: Subscription, ctx: DeliveryContext) -> None:
        self.ctx = ctx
        self.sub = sub
        self.signer = Signer(sub.secrets)
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.in_flight = 0
        self.limit = asyncio.Semaphore(sub.max_in_flight)
        self.delivered = RollingCounter()
        self.failed = RollingCounter()

    def update(self, sub: Subscription) -> None:
        """New settings take effect with the next request; the owning relay notices a change
        on its next round (every claim_interval seconds)."""
        if sub.max_in_flight != self.sub.max_in_flight:
            self.limit = asyncio.Semaphore(sub.max_in_flight)
        self.sub = sub
        self.signer = Signer(sub.secrets)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    async def run(self) -> None:
        loops = [asyncio.create_task(self._batch_loop()), asyncio.create_task(self._retry_loop())]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

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
        more = False  # the last read stopped short of the newest tick (batch size limit)
        last_read = 0.0
        try:
            while True:
                try:
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
                    # Read when there may be something new: a tick was announced, the
                    # last read was cut short, acknowledgements are waiting, or the
                    # fallback poll is due (a lost notification costs latency, not data).
                    due = fresh or more or acks is not None or self.wake.is_set()
                    if room and (due or time.monotonic() - last_read >= self.ctx.poll_interval):
                        self.wake.clear()
                        last_read = time.monotonic()
                        rows = await self._step(acks, peek_after=ahead, peek=True)
                        acks, fresh, more = None, False, False
                        if rows:
                            events = [OutEvent.from_row(r) for r in rows if r["id"] is not None]
                            blocked = {r["key"] for r in rows if r["blocked"]}
                            task = asyncio.create_task(self._deliver_batch(events, blocked))
                            flights.append(_Flight(rows[0]["start_tick"], rows[0]["end_tick"], task))
                            ahead, more = rows[0]["end_tick"], rows[0]["more"]
                            continue
                    timeout = max(0.0, last_read + self.ctx.poll_interval - time.monotonic()) if room else None
                    await self._wait(flights[0].task if flights else None, wake=room, timeout=timeout)
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate != CURSOR_MOVED:
                        raise
                    # Another relay delivered this subscription for a moment: what it
                    # acknowledged is done; start over from where the cursor is now.
                    log.warning("subscription %s: %s; reading again from its cursor", self.sub.name, exc)
                    for flight in flights:
                        flight.task.cancel()
                    await asyncio.gather(*(f.task for f in flights), return_exceptions=True)
                    flights.clear()
                    acks, ahead, fresh = None, None, True
        finally:
            for flight in flights:
                flight.task.cancel()
            if acks is not None:  # delivered batches not recorded yet: record them now, not after a restart
                await self._step(acks, peek_after=None, peek=False)

    async def _step(self, acks: _Acks | None, *, peek_after: int | None, peek: bool) -> list[asyncpg.Record]:
        async with self.ctx.pool.acquire() as conn:
            return await conn.fetch(  # type: ignore[no-any-return]
                sql.query("webhook_step"), self.sub.name, self.sub.consumer, self.ctx.max_batch_events,
                self.sub.ordered, *(acks.args() if acks else NO_ACKS), peek, peek_after,
            )  # fmt: skip

    async def _deliver_batch(self, events: Sequence[OutEvent], blocked: set[str]) -> _Bookkeeping:
        return self._account(await self._deliver(events, blocked) if events else [], from_batch=True)

    async def _wait(self, head: asyncio.Task[_Bookkeeping] | None, *, wake: bool, timeout: float | None) -> None:
        """Until the oldest batch in flight is done, or (``wake``) a tick is announced, or ``timeout``."""
        waiters: set[asyncio.Future[Any]] = set() if head is None else {head}
        waker = asyncio.ensure_future(self.wake.wait()) if wake else None
        if waker is not None:
            waiters.add(waker)
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if waker is not None:
                waker.cancel()

    async def _retry_loop(self) -> None:
        while not self.stopping.is_set():
            async with self.ctx.pool.acquire() as conn:
                rows = await conn.fetch(sql.query("due_retries"), self.sub.name, self.sub.ordered, self.ctx.retry_fetch)
                next_at = (
                    None if rows else await conn.fetchval(sql.query("next_retry_at"), self.sub.name, self.sub.ordered)
                )
            if not rows:
                delay = self.ctx.poll_interval
                if next_at is not None:
                    delay = min(delay, max(0.0, (next_at - datetime.now(UTC)).total_seconds()))
                await wait_for_event(self.stopping, delay)
                continue
            events = [OutEvent.from_row(r) for r in rows]
            await self._record(self._account(await self._deliver(events, set()), from_batch=False), advance=None)

    # -- sending -----------------------------------------------------------

    async def _send(self, chunk: Sequence[OutEvent]) -> HttpResult:
        sub = self.sub
        req = None
        if sub.kind != "pg_net":
            try:
                req = request.build(sub, chunk, self.signer, max_body_bytes=self.ctx.max_body_bytes)
            except request.BadRequest as exc:
                return HttpResult(None, exc.error_class, str(exc), None, 0.0)
        # The subscription's limit covers the batch and the retry loop together.
        async with self.limit, self.ctx.global_limit:
            self.in_flight += len(chunk)
            try:
                return await self._transmit(chunk, req)
            except Exception as exc:  # a bug of ours must cost a retry, not the worker
                log.exception("subscription %s: unexpected error sending events %s", sub.name, [e.id for e in chunk])
                return HttpResult(None, "internal", f"pgferry internal error: {exc!r}", None, 0.0)
            finally:
                self.in_flight -= len(chunk)

    async def _transmit(self, chunk: Sequence[OutEvent], req: request.Request | None) -> HttpResult:
        sub = self.sub
        if req is None:
            return await pg_net.send(self.ctx.sender, sub, chunk[0], max_body_bytes=self.ctx.max_body_bytes)
        return await self.ctx.webhooks.send(
            sub.url,
            req.body,
            req.headers,
            timeout=sub.timeout_ms / 1000,
            connect_timeout=sub.connect_timeout_ms / 1000,
        )

    async def _deliver(self, events: Sequence[OutEvent], blocked: set[str]) -> list[Outcome]:
        sub = self.sub
        outcomes: list[Outcome] = []
        batch_size = 1 if sub.kind == "pg_net" else sub.batch_size
        if not sub.ordered:
            chunks = deque(events[i : i + batch_size] for i in range(0, len(events), batch_size))

            async def drain() -> None:
                while chunks:
                    chunk = chunks.popleft()
                    result = await self._send(chunk)
                    outcomes.extend((e, result) for e in chunk)

            await asyncio.gather(*(drain() for _ in range(min(sub.max_in_flight, len(chunks)))))
            return outcomes

        n_lanes = max(1, min(sub.max_in_flight, len(events)))
        lanes: list[list[OutEvent]] = [[] for _ in range(n_lanes)]
        for e in events:
            lane = zlib.crc32(e.key.encode()) if e.key is not None else e.id
            lanes[lane % n_lanes].append(e)

        async def run_lane(lane_events: list[OutEvent]) -> None:
            chunk: list[OutEvent] = []

            async def flush() -> None:
                result = await self._send(chunk)
                outcomes.extend((e, result) for e in chunk)
                if not result.ok:
                    blocked.update(e.key for e in chunk if e.key is not None)
                chunk.clear()

            for e in lane_events:
                if e.key is not None and e.key in blocked:
                    outcomes.append((e, None))
                    continue
                chunk.append(e)
                if len(chunk) >= batch_size:
                    await flush()
            if chunk:
                await flush()

        await asyncio.gather(*(run_lane(lane) for lane in lanes if lane))
        return outcomes

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
            attempt = event.attempts + 1
            books.attempts.append(
                (sub.name, event.id, attempt, result.status, result.error_class, result.error,
                 result.response, result.latency_ms, now)
            )  # fmt: skip
            if sub.kind == "pg_net" and pg_net.is_final(result):
                books.delivered.append(event.id)
                books.responses.append(pg_net.response_row(event, result))
                continue
            if result.ok:
                books.delivered.append(event.id)
                continue
            if result.status == 410 and sub.kind == "webhook":
                books.gone = f"endpoint answered 410 Gone at {now:%Y-%m-%d %H:%M:%S}Z; resume the subscription to retry"
            first_failed = event.first_failed_at or now
            verdict = judge(sub, result, attempt, first_failed, now)
            if verdict.dead:
                books.bury.append(_buried(event, attempt, first_failed, result))
                if sub.kind == "pg_net":
                    books.responses.append(pg_net.response_row(event, result))
            else:
                books.park.append(_parked(event, attempt, first_failed, verdict.next_attempt_at or now, result))
        self.delivered.add(len(books.delivered))
        self.failed.add(len(books.attempts) - len(books.delivered))
        return books

    async def _record(self, books: _Bookkeeping, *, advance: tuple[int, int] | None) -> None:
        """Records attempts, parks and buries failures, and moves the cursor over the batch
        (``advance``: from tick, to tick; None for parked retries), in one transaction."""
        sub = self.sub
        async with self.ctx.pool.acquire() as conn, conn.transaction():
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
        if books.bury:
            log.warning("subscription %s: %d event(s) moved to dead letters", sub.name, len(books.bury))


def _parked(
    event: OutEvent, attempts: int, first_failed: datetime, next_at: datetime, result: HttpResult | None
) -> tuple[Any, ...]:
    return (
        event.id, event.stream, event.key, event.payload, event.headers, event.created_at, attempts,
        first_failed, next_at,
        result.status if result else None, result.error if result else None, result.response if result else None,
    )  # fmt: skip


def _buried(event: OutEvent, attempts: int, first_failed: datetime, result: HttpResult) -> tuple[Any, ...]:
    return (
        event.id, event.stream, event.key, event.payload, event.headers, event.created_at, attempts,
        first_failed, result.status, result.error, result.response,
    )  # fmt: skip
