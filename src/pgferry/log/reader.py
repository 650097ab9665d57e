"""Stream readers: a consumer's batches as an async iterator, with explicit ack.

A reader holds its consumer's advisory lock on a dedicated connection, so two
processes never read the same consumer at once (a second one waits as a
standby). It wakes on the ticker's NOTIFY and also polls every
``poll_interval`` seconds, so a lost notification costs latency, never data.
If the connection drops it reconnects with backoff and re-LISTENs (asyncpg
does not do that by itself); an unacknowledged batch is simply handed out
again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import DatabaseUnreachable
from pgferry.log.events import Batch, Event
from pgferry.schema import CONSUMER_LOCK_CLASS

log = logging.getLogger(__name__)

TICK_CHANNEL = "pgferry_tick"


def _setter(event: asyncio.Event) -> Callable[..., None]:
    return lambda *_: event.set()


@dataclass
class ReaderSettings:
    consumer: str
    streams: Sequence[str] | None = None
    start_at: str = "now"
    max_events: int | None = None
    poll_interval: float = 1.0
    max_backoff: float = 10.0


class StreamReader:
    """``async for batch in reader`` yields non-empty batches until the loop is left."""

    def __init__(self, url: str, settings: ReaderSettings) -> None:
        if settings.start_at not in ("now", "beginning"):
            raise ValueError(f"start_at must be 'now' or 'beginning', not {settings.start_at!r}")
        self.url = url
        self.settings = settings
        self._conn: asyncpg.Connection | None = None
        self._iterator: AsyncIterator[Batch] | None = None

    def __aiter__(self) -> AsyncIterator[Batch]:
        if self._iterator is None:
            self._iterator = self._batches()
        return self._iterator

    async def close(self) -> None:
        """Stop reading: closes the connection, which releases the consumer to a standby."""
        if self._iterator is not None:
            await self._iterator.aclose()  # type: ignore[attr-defined]
            self._iterator = None

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _batches(self) -> AsyncIterator[Batch]:
        first = True
        failures = 0
        while True:
            try:
                conn = await db.connect(self.url, server_settings={"application_name": "pgferry reader"})
            except DatabaseUnreachable:
                if first:
                    raise
                failures += 1
                await self._backoff(failures, "reconnect")
                continue
            first = False
            self._conn = conn
            try:
                # Lock first: a standby must not re-register (and so change the
                # streams of) a consumer another process is reading.
                await self._acquire(conn)
                await self._ensure_consumer(conn)
                wake = asyncio.Event()
                await conn.add_listener(TICK_CHANNEL, _setter(wake))
                failures = 0
                unacked: int | None = None
                while True:
                    wake.clear()
                    batch = await self._next_batch(conn)
                    if batch is None:
                        await wait_for_event(wake, self.settings.poll_interval)
                        continue
                    if batch.id == unacked:
                        # The caller went on without acking: hand the batch out
                        # again, but not in a tight loop.
                        await asyncio.sleep(self.settings.poll_interval)
                    yield batch
                    unacked = None if batch.acked else batch.id
            except CONNECTION_ERRORS as exc:
                failures += 1
                log.warning("reader %s lost its database connection: %s", self.settings.consumer, exc)
                await self._backoff(failures, "reconnect")
            finally:
                self._conn = None
                if not conn.is_closed():
                    try:
                        await asyncio.wait_for(conn.close(), 5)
                    except Exception:  # noqa: BLE001 - a broken connection must not mask the real error
                        conn.terminate()

    async def _backoff(self, failures: int, what: str) -> None:
        delay = backoff_delay(failures, cap=self.settings.max_backoff)
        log.info("reader %s: %s in %.1f s", self.settings.consumer, what, delay)
        await asyncio.sleep(delay)

    async def _ensure_consumer(self, conn: asyncpg.Connection) -> None:
        s = self.settings
        existing = await conn.fetchrow(sql.query("consumer_streams"), s.consumer)
        streams = list(s.streams) if s.streams is not None else None
        if existing is None or (streams is not None and sorted(existing["streams"] or []) != sorted(streams)):
            await conn.execute(sql.query("register_consumer"), s.consumer, streams, s.start_at)

    async def _acquire(self, conn: asyncpg.Connection) -> None:
        key = await conn.fetchval(sql.query("consumer_lock_key"), self.settings.consumer)
        warned = False
        while not await conn.fetchval(sql.query("try_advisory_lock"), CONSUMER_LOCK_CLASS, key):
            if not warned:
                log.info("consumer %s is being read by another process; waiting to take over", self.settings.consumer)
                warned = True
            await asyncio.sleep(self.settings.poll_interval)
        if warned:
            log.info("consumer %s: took over reading", self.settings.consumer)

    async def _next_batch(self, conn: asyncpg.Connection) -> Batch | None:
        """The next batch with events for us; batches with none are acked on the way."""
        s = self.settings
        while True:
            row = await conn.fetchrow(sql.query("next_batch"), s.consumer, s.max_events)
            if row is None:
                return None
            rows = await conn.fetch(
                sql.query("batch_events"), row["start_tick"], row["end_tick"], row["streams"], s.consumer
            )
            batch = Batch(
                id=row["batch_id"],
                consumer=s.consumer,
                start_tick=row["start_tick"],
                end_tick=row["end_tick"],
                events=[Event.from_row(r) for r in rows],
                _ack=self._ack,
            )
            if batch.events:
                return batch
            await batch.ack()

    async def _ack(self, batch: Batch) -> bool:
        conn = self._conn
        if conn is None or conn.is_closed():
            log.warning("reader %s: cannot ack batch %d, the connection is gone; it will be read again",
                        batch.consumer, batch.id)  # fmt: skip
            return False
        try:
            await conn.execute(sql.query("finish_batch"), batch.consumer, batch.id)
        except CONNECTION_ERRORS as exc:
            log.warning("reader %s: connection lost while acking batch %d (%s); unless that ack committed, "
                        "the batch will be read again", batch.consumer, batch.id, exc)  # fmt: skip
            return False
        return True
