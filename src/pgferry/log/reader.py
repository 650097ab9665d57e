"""Stream readers: a consumer's batches as an async iterator, with explicit ack.

A reader holds its consumer's advisory lock on a dedicated connection, so two
processes never read the same consumer at once (a second one waits as a
standby). It wakes on the ticker's NOTIFY and also polls every
``poll_interval`` seconds, so a lost notification costs latency, never data.
If the connection drops it reconnects with backoff and re-LISTENs (asyncpg
does not do that by itself); an unacknowledged batch is simply handed out
again.

The reader's connection has the relay's liveness deadlines (``db.Liveness``):
every statement gets ``command_timeout``, after which the reader drops the
connection and reconnects, and PostgreSQL ends the session once it has been
silent for ``session_timeout``, so a reader cut off behind a black-holed link
stops holding its consumer's lock and a standby takes over. While a batch is
out with the caller the reader keeps its session alive with a ping every
third of ``session_timeout`` (a caller may take its time over a batch).

A consumer that fell behind the retention limit and lost events to it
(migration 0014) raises :class:`~pgferry.errors.ConsumerStalled` naming the
gap, rather than reading on past it; ``Ferry.resume_consumer`` acknowledges it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import ConsumerStalled, DatabaseUnreachable, one_line
from pgferry.log.events import Batch, Event
from pgferry.log.ticks import Snapshot, commit_ticks, range_ticks
from pgferry.schema import CONSUMER_LOCK_CLASS

log = logging.getLogger(__name__)

TICK_CHANNEL = "pgferry_tick"
#: ferry._skip_to: a consumer's cursor moved over events it had not read (a retention gap)
MOVED_CHANNEL = "pgferry_moved"


def in_commit_order(events: list[Event], ticks: Sequence[tuple[int, Snapshot]]) -> list[Event]:
    """A batch of several ticks by commit tick, then id (the order stream readers' offsets give):
    in id order, a transaction's WAL-captured events, whose ids are drawn when the relay appends
    them, come after those of transactions that committed just after it (migration 0028)."""
    found = commit_ticks([e.txid for e in events], ticks)
    last = ticks[-1][0] if ticks else 0
    keyed = sorted(zip(found, events, strict=True), key=lambda p: (last if p[0] is None else p[0], p[1].id))
    return [e for _, e in keyed]


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
    #: deadlines of the reader's connection (it holds the consumer's lock, like the relay's sessions)
    liveness: db.Liveness = field(default_factory=db.Liveness)

    def __post_init__(self) -> None:
        if self.liveness.session_timeout <= self.poll_interval:
            raise ValueError(
                f"the reader's session_timeout ({self.liveness.session_timeout} s) must be longer than its "
                f"poll_interval ({self.poll_interval} s), or PostgreSQL would end a healthy idle reader"
            )


class StreamReader:
    """``async for batch in reader`` yields non-empty batches until the loop is left.

    The reader owns its iteration: ``aiter(reader)`` is the same iterator until ``close()``,
    so a caller holding the reader may leave a loop and come back, or ack a batch after
    leaving it. The connection and the consumer's lock live in a ``_Session`` that the
    iterator and the batches refer to, never the reader itself: nothing refers back to
    the reader, so a reader nobody holds (``async for batch in ferry.read(...)`` left
    with ``break``) is freed at once, and with it the iterator, which closes the
    connection and releases the consumer then, not when the cyclic garbage collector runs.
    """

    def __init__(self, url: str, settings: ReaderSettings) -> None:
        if settings.start_at not in ("now", "beginning"):
            raise ValueError(f"start_at must be 'now' or 'beginning', not {settings.start_at!r}")
        self.url = url
        self.settings = settings
        self._session = _Session(url, settings)
        self._iterator: AsyncGenerator[Batch, None] | None = None

    def __aiter__(self) -> AsyncIterator[Batch]:
        if self._iterator is None:
            self._iterator = self._session.batches()
        return self._iterator

    async def close(self) -> None:
        """Stop reading: closes the connection, which releases the consumer to a standby."""
        if self._iterator is not None:
            await self._iterator.aclose()
            self._iterator = None

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Session:
    """A reader's connection and what runs on it: the batches, the keepalive, acks."""

    def __init__(self, url: str, settings: ReaderSettings) -> None:
        self.url = url
        self.settings = settings
        self._conn: asyncpg.Connection | None = None
        #: one statement at a time on the connection: the reader's own, an ack, or a keepalive ping
        self._busy = asyncio.Lock()

    async def batches(self) -> AsyncGenerator[Batch, None]:
        first = True
        failures = 0
        while True:
            try:
                kwargs = self.settings.liveness.connect_kwargs("pgferry reader", holds_locks=True)
                kwargs["server_settings"].update(db.LOG_READER_SETTINGS)
                conn = await db.connect(self.url, **kwargs)
            except DatabaseUnreachable:
                if first:
                    raise
                failures += 1
                await self._backoff(failures, "reconnect")
                continue
            first = False
            self._conn = conn
            keepalive = asyncio.create_task(self._keepalive(conn), name=f"reader {self.settings.consumer} keepalive")
            try:
                # Lock first: a standby must not re-register (and so change the
                # streams of) a consumer another process is reading.
                await self._acquire(conn)
                await self._ensure_consumer(conn)
                wake = asyncio.Event()
                async with self._busy:
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
                log.warning("reader %s lost its database connection: %s", self.settings.consumer, db.describe(exc))
                await self._backoff(failures, "reconnect")
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == ConsumerStalled.SQLSTATE:
                    raise ConsumerStalled(self.settings.consumer, one_line(exc)) from None
                raise
            finally:
                keepalive.cancel()
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

    async def _keepalive(self, conn: asyncpg.Connection) -> None:
        """Ping while the connection is otherwise quiet (a batch out with the caller), so that
        ``idle_session_timeout`` ends only a reader that was cut off; a ping that fails or gets no
        answer in ``command_timeout`` drops the connection, and the reader reconnects."""
        interval = self.settings.liveness.session_timeout / 3
        try:
            while not conn.is_closed():
                await asyncio.sleep(interval)
                async with self._busy:
                    await conn.execute("select 1")
        except CONNECTION_ERRORS as exc:
            log.warning("reader %s: keepalive failed (%s); dropping the connection", self.settings.consumer,
                        db.describe(exc))  # fmt: skip
            conn.terminate()

    async def _ensure_consumer(self, conn: asyncpg.Connection) -> None:
        s = self.settings
        async with self._busy:
            existing = await conn.fetchrow(sql.query("consumer_streams"), s.consumer)
            streams = list(s.streams) if s.streams is not None else None
            if existing is None or (streams is not None and sorted(existing["streams"] or []) != sorted(streams)):
                await conn.execute(sql.query("register_consumer"), s.consumer, streams, s.start_at)

    async def _fetchval(self, conn: asyncpg.Connection, query: str, *args: object) -> object:
        async with self._busy:
            return await conn.fetchval(query, *args)

    async def _acquire(self, conn: asyncpg.Connection) -> None:
        key = await self._fetchval(conn, sql.query("consumer_lock_key"), self.settings.consumer)
        warned = False
        while not await self._fetchval(conn, sql.query("try_advisory_lock"), CONSUMER_LOCK_CLASS, key):
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
            async with self._busy:
                row = await conn.fetchrow(sql.query("next_batch"), s.consumer, s.max_events)
                if row is None:
                    return None
                rows = await conn.fetch(
                    sql.query("batch_events"), row["start_tick"], row["end_tick"], row["streams"], s.consumer
                )
                events = [Event.from_row(r) for r in rows]
                if len({e.txid for e in events}) > 1 and row["end_tick"] - row["start_tick"] > 1:
                    ticks = await range_ticks(conn, row["start_tick"], row["end_tick"])
                    events = in_commit_order(events, ticks)
            batch = Batch(
                id=row["batch_id"],
                consumer=s.consumer,
                start_tick=row["start_tick"],
                end_tick=row["end_tick"],
                events=events,
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
            async with self._busy:
                await conn.execute(sql.query("finish_batch"), batch.consumer, batch.id)
        except CONNECTION_ERRORS as exc:
            log.warning("reader %s: connection lost while acking batch %d (%s); unless that ack committed, "
                        "the batch will be read again", batch.consumer, batch.id, exc)  # fmt: skip
            return False
        return True
