"""Every worker's round trip to the log, many subscriptions per statement.

A worker's step acknowledges its delivered batches and reads its next one
(``ferry.webhook_steps``). With 1,000 subscriptions on one stream, a tick
used to cost 1,000 such statements, each reading the same events and each
committing on its own. The Stepper gathers the steps workers ask for while
a statement is in flight and sends them as ONE statement: one commit for all
the acknowledgements, one read for every subscription at the same position
on the same streams. A lone worker waits for nobody: its step goes out at
once, as before.

With a read budget (``delivery.budget``), a statement's reads share the
relay's free bytes: each gets the statement's bound (``max_bytes``), at most
the subscription's share, and reads that do not fit wait for the next
statement, once a delivered batch gives its bytes back. A read's step then
holds what it returned (``Step.held``) until its worker releases it (a worker
cancelled before it took its answer gives it back in ``Stepper.step``).

A statement PostgreSQL rolls back as a deadlock's victim (an operator's
transaction locking consumer rows in another order: `pgferry apply`, even
with --dry-run) or a serialization failure is sent again: it did nothing,
and failing it failed every worker in it, each starting over and sending its
delivered batches again (hundreds of duplicates per deadlock; outside probe).

A step the database refuses for one subscription (its cursor moved, another
relay claimed it, its tick is gone) fails only that worker's call, with
:class:`StepRefused` and the SQLSTATE ``ferry.webhook_step`` would raise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from pgferry import db, sql
from pgferry.delivery.budget import ReadBudget

log = logging.getLogger(__name__)

#: Steps per statement at most (a statement's arrays grow with it).
MAX_STEPS = 1000
#: Statements in flight at once: one being answered while the next gathers steps.
PARALLEL = 1

_REASONS = {
    "PF001": "another process moved its cursor",
    "PF002": "another relay claimed it (its ownership epoch is over)",
    "42704": "its consumer does not exist",
    "55000": "its cursor's tick is no longer retained",
}


class StepRefused(Exception):
    """The database refused one subscription's step; ``sqlstate`` says why."""

    def __init__(self, subscription: str, sqlstate: str) -> None:
        super().__init__(f"pgferry: subscription {subscription!r}: {_REASONS.get(sqlstate, sqlstate)}")
        self.sqlstate = sqlstate


@dataclass
class Step:
    """One worker's step: what to acknowledge, and whether (and after which tick) to read."""

    subscription: str
    consumer: str
    epoch: int | None
    ordered: bool
    #: (from tick, to tick, attempts as (event id, attempt, status, latency ms), the part of a range
    #: read in parts it ends with as (its end tick, its last id), or None) or None
    ack: tuple[int, int, Sequence[tuple[int, int, int | None, float | None]], tuple[int, int] | None] | None
    peek: bool
    peek_after: int | None
    #: the rest of a range the byte bound cut inside a transaction: (its end tick, the last id read)
    resume: tuple[int, int] | None = None
    #: events the read's range is sized for (None: the relay's max_batch_events)
    span: int | None = None
    result: asyncio.Future[list[asyncpg.Record]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    #: the last read filled its bound and more is left: this one asks the read budget for its whole share
    whole: bool = False
    #: the byte bound the read budget gave the read (None: no budget)
    bound: int | None = None
    #: bytes of the read's events held in the read budget, which its worker releases once they are delivered
    held: int = 0


class Stepper:
    def __init__(
        self,
        pool: asyncpg.Pool,
        max_batch_events: int | None,
        max_bytes: int | None = None,
        budget: ReadBudget | None = None,
    ) -> None:
        self.pool = pool
        self.max_batch_events = max_batch_events
        #: the byte bound of each read (DeliveryContext.read_bytes; None: unbounded)
        self.max_bytes = max_bytes
        #: the relay's read budget, shared by every read (None: none; DeliveryContext gives one only
        #: with max_bytes)
        self.budget = budget
        self._queue: list[Step] = []
        self._running = 0
        #: set when a step joins the queue (the drain loop may be waiting for the budget)
        self._joined = asyncio.Event()
        #: statements sent and steps they carried (metrics, tests)
        self.statements = 0
        self.steps = 0

    async def step(self, step: Step) -> list[asyncpg.Record]:
        """The step's rows (``ferry.webhook_steps``' columns but ``refused``); raises StepRefused."""
        self._queue.append(step)
        self._joined.set()
        if self._running < PARALLEL:
            self._running += 1
            asyncio.get_running_loop().create_task(self._drain())
        try:
            return await step.result
        except asyncio.CancelledError:
            # Cancelled once the read was answered (its result set, its caller not resumed yet:
            # a worker stopped by its owner): nobody takes its events off, so its bytes go back now.
            self._give_back(step)
            raise

    def _give_back(self, step: Step) -> None:
        """Returns a read's bytes to the read budget (once: its caller will not release them)."""
        if self.budget is not None and step.held:
            held, step.held = step.held, 0
            self.budget.release(held)

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the steps asked for in this turn of the loop join
            await self._drain_queue()
        except Exception as exc:
            # Never end with steps waiting: every worker of the relay waits on this runner, and an
            # error here (a MemoryError building a 62 MB event's batch) left them all waiting, in
            # silence, while status looked healthy (outside probe). Each fails and starts over.
            log.exception("delivery: the shared step runner failed; failing the %d step(s) waiting on it",
                          len(self._queue))  # fmt: skip
            queued, self._queue = self._queue, []
            for step in queued:
                if not step.result.done():
                    step.result.set_exception(exc)
        finally:
            self._running -= 1

    async def _drain_queue(self) -> None:
        while self._queue:
            self._joined.clear()
            batch, bound, reserved = self._take()
            if batch:
                await self._send(batch, bound, reserved)
            elif self._queue:  # only reads, and no room for any: until bytes are given back or a step joins
                assert self.budget is not None and self.max_bytes is not None
                whole = all(s.whole for s in self._queue if s.peek)
                need = min(self.max_bytes, self.budget.total) if whole else self.budget.least(self.max_bytes)
                given_back = self.budget.waiter(need)
                joined: asyncio.Future[Any] = asyncio.ensure_future(self._joined.wait())
                try:
                    await asyncio.wait([given_back, joined], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    given_back.cancel()
                    joined.cancel()

    def _take(self) -> tuple[list[Step], int | None, int]:
        """The next statement's steps, its reads' byte bound, and the bytes reserved for them;
        reads the budget has no room for stay queued, in order."""
        queue = [s for s in self._queue if not s.result.done()]
        if self.budget is None:
            self._queue = queue[MAX_STEPS:]
            return queue[:MAX_STEPS], self.max_bytes, 0
        assert self.max_bytes is not None
        head = queue[:MAX_STEPS]
        reads = [s for s in head if s.peek]
        # One statement's reads share one bound: reads after one the byte bound cut (a backlog)
        # ask for their whole share, the others (mostly a new tick) for a part of what is free.
        # The kind the queue's first read is goes first, unless none of it fits.
        chosen: list[Step] = []
        bound = 0
        for whole in [reads[0].whole, not reads[0].whole] if reads else []:
            kind = [s for s in reads if s.whole == whole]
            admitted, bound = self.budget.admit(len(kind), self.max_bytes, whole=whole)
            if admitted:
                chosen = kind[:admitted]
                break
        for s in chosen:
            s.bound = bound
        taken = {id(s) for s in chosen}
        self._queue = [s for s in reads if id(s) not in taken] + queue[MAX_STEPS:]
        batch = [s for s in head if not s.peek or id(s) in taken]
        return batch, bound if chosen else self.max_bytes, bound * len(chosen)

    async def _send(self, batch: list[Step], max_bytes: int | None, reserved: int = 0) -> None:
        try:
            rows = await self._statement(batch, attempt_runs(batch), max_bytes)
        except BaseException as exc:
            self._fail(batch, exc, reserved)
            if not isinstance(exc, Exception):
                raise
            return
        try:
            results, answered = self._sort(batch, rows)
        except Exception as exc:  # its steps fail, not hang (_drain); the budget's bytes go back
            log.exception("delivery: could not take the answer of steps of %d subscription(s)", len(batch))
            self._fail(batch, exc, reserved)
            return
        if self.budget is not None:
            reads = [i for i in answered if batch[i].peek]
            for i, held in zip(reads, self.budget.settle_rows(reserved, [results[i] for i in reads]), strict=True):
                batch[i].held = held
        for i in answered:
            batch[i].result.set_result(results[i])

    def _fail(self, batch: list[Step], exc: BaseException, reserved: int) -> None:
        if self.budget is not None and reserved:
            self.budget.settle(reserved, 0)
        for s in batch:
            if not s.result.done():
                self._give_back(s)
                s.result.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())

    def _sort(self, batch: list[Step], rows: list[asyncpg.Record]) -> tuple[list[list[asyncpg.Record]], list[int]]:
        """Each step's rows, and the steps answered (those refused get their StepRefused now)."""
        self.statements += 1
        self.steps += len(batch)
        results: list[list[asyncpg.Record]] = [[] for _ in batch]
        refused: dict[int, str] = {}
        for row in rows:
            if row["refused"] is not None:
                for i in row["reqs"]:
                    refused[i - 1] = row["refused"]
                continue
            for i in row["reqs"]:
                results[i - 1].append(row)
        answered: list[int] = []
        for i, s in enumerate(batch):
            if s.result.done():
                continue
            if i in refused:
                s.result.set_exception(StepRefused(s.subscription, refused[i]))
                continue
            answered.append(i)
        return results, answered

    async def _statement(self, batch: list[Step], attempts: AttemptRuns, max_bytes: int | None) -> list[asyncpg.Record]:
        """``ferry.webhook_steps`` for ``batch``; again when rolled back as a deadlock's victim or a
        serialization failure (module docstring): the acknowledgements it carries stay valid."""

        async def statement() -> list[asyncpg.Record]:
            async with self.pool.acquire() as conn:
                rows: list[asyncpg.Record] = await conn.fetch(
                    sql.query("webhook_steps"),
                    [s.subscription for s in batch],
                    [s.consumer for s in batch],
                    [s.epoch for s in batch],
                    [s.ordered for s in batch],
                    [s.ack[0] if s.ack else None for s in batch],
                    [s.ack[1] if s.ack else None for s in batch],
                    [s.peek for s in batch],
                    [s.peek_after for s in batch],
                    attempts.reqs,
                    attempts.event_ids,
                    attempts.numbers,
                    attempts.statuses,
                    attempts.latencies,
                    self.max_batch_events,
                    max_bytes,
                    [s.span for s in batch],
                    [s.resume[0] if s.resume else None for s in batch],
                    [s.resume[1] if s.resume else None for s in batch],
                    [s.ack[3][0] if s.ack and s.ack[3] else None for s in batch],
                    [s.ack[3][1] if s.ack and s.ack[3] else None for s in batch],
                    attempts.runs,
                )
            return rows

        return await db.again_if_rolled_back(statement, f"steps of {len(batch)} subscription(s)")


@dataclass
class AttemptRuns:
    """A statement's attempts as ``ferry.webhook_steps`` takes them (migration 0032): each run of
    events that share a step, attempt number, status and latency (a request's events do) is one
    element of ``reqs``, ``numbers``, ``statuses``, ``latencies`` and ``runs`` (its length), and
    its events the next ``runs[k]`` of ``event_ids``."""

    reqs: list[int] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    statuses: list[int | None] = field(default_factory=list)
    latencies: list[float | None] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)


def attempt_runs(batch: Sequence[Step]) -> AttemptRuns:
    """The acknowledgements' attempts of ``batch`` (step i is request i, 1-based) in runs."""
    out = AttemptRuns()
    last: tuple[object, ...] | None = None
    for i, step in enumerate(batch, 1):
        if step.ack is None:
            continue
        for event_id, number, status, latency in step.ack[2]:
            shared = (i, number, status, latency)
            if shared == last:
                out.runs[-1] += 1
            else:
                last = shared
                out.reqs.append(i)
                out.numbers.append(number)
                out.statuses.append(status)
                out.latencies.append(latency)
                out.runs.append(1)
            out.event_ids.append(event_id)
    return out
