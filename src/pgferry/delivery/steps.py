"""Every worker's round trip to the log, many subscriptions per statement.

A worker's step acknowledges its delivered batches and reads its next one
(``ferry.webhook_steps``). With 1,000 subscriptions on one stream, a tick
used to cost 1,000 such statements, each reading the same events and each
committing on its own. The Stepper gathers the steps workers ask for while
a statement is in flight and sends them as ONE statement: one commit for all
the acknowledgements, one read for every subscription at the same position
on the same streams. A lone worker waits for nobody: its step goes out at
once, as before.

A step the database refuses for one subscription (its cursor moved, another
relay claimed it, its tick is gone) fails only that worker's call, with
:class:`StepRefused` and the SQLSTATE ``ferry.webhook_step`` would raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from pgferry import sql

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


class Stepper:
    def __init__(self, pool: asyncpg.Pool, max_batch_events: int | None, max_bytes: int | None = None) -> None:
        self.pool = pool
        self.max_batch_events = max_batch_events
        #: the byte bound of each read (DeliveryContext.read_bytes; None: unbounded)
        self.max_bytes = max_bytes
        self._queue: list[Step] = []
        self._running = 0
        #: statements sent and steps they carried (metrics, tests)
        self.statements = 0
        self.steps = 0

    async def step(self, step: Step) -> list[asyncpg.Record]:
        """The step's rows (``ferry.webhook_steps``' columns but ``refused``); raises StepRefused."""
        self._queue.append(step)
        if self._running < PARALLEL:
            self._running += 1
            asyncio.get_running_loop().create_task(self._drain())
        return await step.result

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the steps asked for in this turn of the loop join
            while self._queue:
                batch, self._queue = self._queue[:MAX_STEPS], self._queue[MAX_STEPS:]
                batch = [s for s in batch if not s.result.done()]
                if batch:
                    await self._send(batch)
        finally:
            self._running -= 1

    async def _send(self, batch: list[Step]) -> None:
        attempts = [(i, *a) for i, s in enumerate(batch, 1) if s.ack is not None for a in s.ack[2]]
        try:
            async with self.pool.acquire() as conn:
                rows = await conn.fetch(
                    sql.query("webhook_steps"),
                    [s.subscription for s in batch],
                    [s.consumer for s in batch],
                    [s.epoch for s in batch],
                    [s.ordered for s in batch],
                    [s.ack[0] if s.ack else None for s in batch],
                    [s.ack[1] if s.ack else None for s in batch],
                    [s.peek for s in batch],
                    [s.peek_after for s in batch],
                    [a[0] for a in attempts],
                    [a[1] for a in attempts],
                    [a[2] for a in attempts],
                    [a[3] for a in attempts],
                    [a[4] for a in attempts],
                    self.max_batch_events,
                    self.max_bytes,
                    [s.span for s in batch],
                    [s.resume[0] if s.resume else None for s in batch],
                    [s.resume[1] if s.resume else None for s in batch],
                    [s.ack[3][0] if s.ack and s.ack[3] else None for s in batch],
                    [s.ack[3][1] if s.ack and s.ack[3] else None for s in batch],
                )
        except BaseException as exc:
            for s in batch:
                if not s.result.done():
                    s.result.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
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
        for i, s in enumerate(batch):
            if s.result.done():
                continue
            if i in refused:
                s.result.set_exception(StepRefused(s.subscription, refused[i]))
            else:
                s.result.set_result(results[i])
