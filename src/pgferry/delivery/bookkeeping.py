"""Recording what a delivery round did, in one transaction: every attempt, the events parked
for a retry (or held, or in flight) and those buried as dead letters, and the cursor's move
over the batch.

Shared by every sink: a sink says what an answer means (``delivered``, ``gone``,
``response_row``), the bookkeeper turns answers into rows. ``account`` runs when the round's
answers are in; ``record`` commits them, fenced by the ownership epoch so that a relay that
lost the subscription cannot record over its new owner (migration 0016).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pgferry import db, sql
from pgferry.delivery.context import DeliveryContext, Held, InFlight, Outcome
from pgferry.delivery.counters import RollingCounter
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.retry import judge
from pgferry.delivery.sink import Sink

log = logging.getLogger(__name__)

ATTEMPT_COLUMNS = (
    "subscription", "event_id", "attempt", "status", "error_class", "error", "response", "latency_ms", "created_at",
)  # fmt: skip
#: What a parked in-flight event's row says (`pgferry trace` shows it as in flight).
IN_FLIGHT_NOTE = "in flight: no answer yet when its batch was recorded; the answer is recorded when it comes"
#: An in-flight event is due again this long after its request's timeout, should the answer never be recorded.
IN_FLIGHT_MARGIN = timedelta(seconds=5)


@dataclass
class Books:
    """The rows one round's outcomes make, until they are recorded."""

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


class Bookkeeper:
    """One subscription's accounting: its counters, and the events sent as probes of a down
    endpoint (judged by the probe rule when their answer comes)."""

    def __init__(self, ctx: DeliveryContext, epoch: int | None) -> None:
        self.ctx = ctx
        #: the ownership epoch every recording checks (None: not fenced)
        self.epoch = epoch
        self.delivered = RollingCounter()
        self.failed = RollingCounter()
        #: events in requests sent as probes of a down endpoint, until their outcome is judged
        self.probes: set[int] = set()

    def account(self, sub: Subscription, sink: Sink, outcomes: Sequence[Outcome], *, from_batch: bool) -> Books:
        """What ``outcomes`` mean for the log: attempts, delivered, parked (when due again), dead."""
        if self.ctx.observe is not None:
            self.ctx.observe(sub.name, outcomes, from_batch)
        now = datetime.now(UTC)
        books = Books()
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
                                          error=IN_FLIGHT_NOTE))  # fmt: skip
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
            delivered = sink.delivered(result)
            probe = event.id in self.probes and not delivered
            error = result.error
            if probe:
                error = f"{error or result.error_class}; {PROBE_NOTE}"
            books.attempts.append(
                (sub.name, event.id, attempt, result.status, result.error_class, error,
                 result.response, result.latency_ms, now)
            )  # fmt: skip
            if delivered:
                books.delivered.append(event.id)
                _respond(sink, books, event, result)
                continue
            gone = sink.gone(result)
            if gone is not None:
                books.gone = f"{gone} at {now:%Y-%m-%d %H:%M:%S}Z; resume the subscription to retry"
            first_failed = event.first_failed_at or now
            if probe:
                self.probes.discard(event.id)
            verdict = judge(sub, result, attempt, first_failed, now, probe=probe)
            if verdict.dead:
                books.bury.append(_buried(event, attempt, first_failed, result))
                _respond(sink, books, event, result)
            else:
                # A failed probe is recorded, and its number used again by the next attempt: it
                # spent none of max_attempts (it did: after a 10 s outage, one 413 from the
                # endpoint back up dead-lettered 9 events of 10 with max_attempts 3; outside probe).
                spent = event.attempts if probe else attempt
                books.park.append(_parked(event, spent, first_failed, verdict.next_attempt_at or now, result))
        self.delivered.add(len(books.delivered))
        self.failed.add(len(books.attempts) - len(books.delivered))
        return books

    async def record(
        self, sub: Subscription, books: Books, *, advance: tuple[int, int] | None, part: tuple[int, int] | None = None
    ) -> None:
        """Records attempts, parks and buries failures, and moves the cursor over the batch
        (``advance``: from tick, to tick; None for parked retries), in one transaction; ``part``:
        the batch is a part of a range read in parts (its end tick, its last id), kept with the
        cursor (migration 0023). A transaction rolled back as a deadlock's victim is run again
        (db.again_if_rolled_back): failing it failed the worker, which sent the batch again."""
        await db.again_if_rolled_back(lambda: self._record(sub, books, advance, part), f"recording {sub.name}")
        if books.recorded is not None:
            books.recorded.set()
        if books.bury:
            log.warning("subscription %s: %d event(s) moved to dead letters", sub.name, len(books.bury))

    async def _record(
        self, sub: Subscription, books: Books, advance: tuple[int, int] | None, part: tuple[int, int] | None
    ) -> None:
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
            if advance is not None:
                await conn.execute(sql.query("advance_consumer"), sub.consumer, *advance)
                if part is not None:
                    await conn.execute(sql.query("part_progress"), sub.consumer, advance[1], *part)


#: What a failed probe's attempt says beside its error, in the attempt history.
PROBE_NOTE = "the endpoint was down and this attempt probed it: not counted against max_attempts"


def _respond(sink: Sink, books: Books, event: OutEvent, result: HttpResult) -> None:
    row = sink.response_row(event, result)
    if row is not None:
        books.responses.append(row)


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
