"""History for the streams API's readers: what a client that starts behind the live feed reads, a
range of the log at a time, in bounded memory, without a database connection of its own.

A reader's ranges are sized in bytes (``Pace``): it learns how many bytes of frames its stream
comes to per event of the log, and asks for about HISTORY_BYTES worth of the log at a time (at
first FIRST_SPAN log events, then up to ``range_events``). A range of several ticks is read whole
on the API's pool, and the connection given back before the client is written to.

One tick is one range at least: one big transaction, which no range size cuts. A tick expected to
come to less than HISTORY_BYTES (its log events times the bytes per log event the reader has seen)
is read on the API's pool through a cursor, a first FIRST_PAGE events and then the rest, so that
one turning out bigger (events larger than those before, or a long transaction's, whose ids were
drawn before the tick it commits in) is stopped at HISTORY_BYTES. Such a tick, and one expected
to be bigger (or, before the reader knows its events' size, of more than FIRST_SPAN events), is
read on through a cursor, a page of about PAGE_BYTES at a time, on a connection of a small pool
of its own (``ApiSettings.history_connections``): the reader holds that connection while it writes
each page to its client, however slowly the client reads, so not one of the API's pool, which
everyone needs; and a bounded one, so that any number of clients catching up at once cannot use
up the server's max_connections (beyond that, they wait their turn). Those connections stay open
between ticks and readers: one opened per tick, 100-event pages, and every tick bigger than a
reader's first span (200 events) read that way made catching up on a 1,000,000-event stream in
ticks of 10,000 cost 100 connections and 10,000 fetches (82,000-105,000 events/s over SSE,
against the 100,000 targeted, as the machine was busy; bench streams, 200,000 events). A reader
whose stream is a fraction of a tick's events reads only its own from the cursor.

A long-poll reads the same way, with a number of events it wants (``rows``): its ranges are sized
so as not to read far more than it wants, and a tick is read through the cursor on the API's pool
up to that number (it writes its answer only once it has read it), so that a poll of 1,000 events
of a 10,000-event tick reads 1,000 (it read the whole tick, ten times over for the ten polls);
and an answer stops at about HISTORY_BYTES.

An SSE client's next range is read while it is written the one before (``read_on``'s prefetch;
a long-poll reads each range once the one before is framed).
Payloads are read as their JSON text and written out as they are (``reader.JsonText``).

What stays bounded by estimate only: a range of several ticks is read whole, sized from the
events read before (events far bigger than those make a bigger range, up to ``range_events``
log events), and so is a page (up to MAX_PAGE events).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import asyncpg

from pgferry import db, sql
from pgferry.streams.offsets import Offset
from pgferry.streams.reader import Position, StreamEvent, range_end, read_range_to, tick_cursor

#: Bytes of frames a range of history aims at. Ranges were 10,000 log events whatever their size:
#: ~170 MB of relay memory per client catching up on 50 KB events (outside probe).
HISTORY_BYTES = 4 << 20
#: Log events of a reader's first range, before it knows how big its events are.
FIRST_SPAN = 200
#: Bytes one page of a tick read through a cursor aims at; its first page, events.
PAGE_BYTES = 1 << 20
FIRST_PAGE = 100
#: The most events one page may hold, whatever their size.
MAX_PAGE = 10_000
#: Bytes of an event's frame besides its payload (offset, id, stream, created_at, ...).
EVENT_BYTES = 150


@dataclass
class Pace:
    """How big one reader's events have been, to size its next read: bytes of frames per event of
    the log in the ranges it read, and per event of its stream."""

    range_events: int
    per_log_event: float | None = None
    per_event: float | None = None
    _bytes: int = 0

    def framed(self, events: int, nbytes: int) -> None:
        """``events`` events of the stream came to ``nbytes`` bytes."""
        if events:
            self.per_event = nbytes / events
        self._bytes += nbytes

    def ranged(self, log_events: int) -> None:
        """The range of ``log_events`` log events just read was framed whole: bigger events count at
        once, smaller ones by halves (a span doubles at most from one range to the next)."""
        seen = self._bytes / max(log_events, 1)
        self.per_log_event = seen if self.per_log_event is None else max(seen, self.per_log_event / 2)
        self._bytes = 0

    def span(self, rows: int | None = None) -> int:
        """Log events of the next range: about HISTORY_BYTES of frames, and, for a reader that
        wants ``rows`` events, about that many of its stream."""
        if self.per_log_event is None:
            span = FIRST_SPAN
        elif self.per_log_event > 0:
            span = int(HISTORY_BYTES / self.per_log_event)
        else:
            span = self.range_events
        if rows is not None and self.per_log_event is None:
            span = min(span, rows + 1)
        elif rows is not None and self.per_event and self.per_log_event:
            # events of the log per event of the stream, as far as seen (none seen: no cap)
            span = min(span, int(rows * self.per_event / self.per_log_event) + 1)
        return max(1, min(self.range_events, span))

    def paged(self, log_events: int) -> bool:
        """Whether a tick of ``log_events`` log events is read in pages, on a connection of its
        own: more than HISTORY_BYTES expected (not known yet: more than FIRST_SPAN events)."""
        if self.per_log_event is None:
            return log_events > FIRST_SPAN
        return log_events * self.per_log_event > HISTORY_BYTES

    def page_rows(self, left: int | None = None) -> int:
        """Events to fetch for the next page: about PAGE_BYTES, at most ``left``."""
        rows = FIRST_PAGE if not self.per_event else int(PAGE_BYTES / self.per_event)
        rows = max(1, min(MAX_PAGE, rows))
        return rows if left is None else max(1, min(rows, left))


class History:
    """Ranges of history for the API's readers, over the API's pool and a small one for big ticks."""

    def __init__(self, url: str, connections: int) -> None:
        self.url = url
        self.connections = connections
        self.pool: asyncpg.Pool | None = None
        #: the connections big ticks are read on, opened as needed, at most ``connections``
        self.paging: asyncpg.Pool | None = None

    async def open(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.paging = await db.create_pool(
            self.url, min_size=0, max_size=self.connections, reset=db.rollback_if_open,
            server_settings={"application_name": "pgferry streams history", **db.LOG_READER_SETTINGS},
        )  # fmt: skip

    async def close(self) -> None:
        if self.paging is not None:
            await self.paging.close()

    async def read_on(
        self,
        stream: str,
        position: Position,
        pace: Pace,
        until: Callable[[], int],
        *,
        rows: int | None = None,
        prefetch: bool = True,
    ) -> AsyncGenerator[tuple[list[StreamEvent], Position], None]:
        """The stream's events range after range, while ranges start before tick ``until()`` (where
        the live feed is), in offset order, each range in one piece or in pages, each with the
        position after it (a page of a tick: after its last event); it ends when no newer tick
        exists. ``rows``: the reader wants no more than that many events in all (a long-poll),
        it stops at them. ``prefetch``: each range that is read whole is read while the caller
        writes the one before: one after the other, the relay framed while the database waited and
        the other way round (a range more is held in memory for it). A caller frames what it is
        given (``pace.framed``) before it asks for more, and may stop between pages
        (``contextlib.aclosing``: a page read holds a connection). OffsetExpired when retention
        has dropped a range."""
        ahead: asyncio.Task[_Range | None] | None = None
        left = rows
        try:
            while position.lower < until() and (left is None or left > 0):
                read = await (ahead if ahead is not None else self._read(stream, position, pace, left))
                ahead = None
                if read is None:
                    return
                if not read.complete:
                    async for page in self._rest(stream, position, pace, read, left):
                        if left is not None:
                            left -= len(page[0])
                        yield page
                    position = read.after
                    continue
                if left is not None:
                    left -= len(read.events)
                if prefetch and read.after.lower < until():
                    ahead = asyncio.create_task(self._read(stream, read.after, pace, left))
                yield read.take(), read.after
                pace.ranged(read.log_events)
                position = read.after
        finally:
            if ahead is not None:
                ahead.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ahead

    async def _read(self, stream: str, position: Position, pace: Pace, rows: int | None = None) -> _Range | None:
        """The next range on the API's pool: whole, or up to where a tick is read on in pages."""
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            end = await range_end(conn, position, pace.span(rows))
            if end is None:
                return None
            size = await conn.fetchrow(sql.query("stream_range_size"), position.lower, end)
            assert size is not None
            log_events = int(size["events"] or 0)
            complete = True
            if size["ticks"] > 1:
                events = await read_range_to(conn, stream, position, end)
            elif rows is None and pace.paged(log_events):  # (a long-poll reads what it wants on the pool)
                events, complete = [], False
            else:
                events, complete = await _read_tick(conn, stream, position, end, log_events, rows)
        return _Range(events, Position(end, position.floor), complete, log_events)

    async def _rest(
        self, stream: str, position: Position, pace: Pace, read: _Range, rows: int | None = None
    ) -> AsyncGenerator[tuple[list[StreamEvent], Position], None]:
        """The pages of the one tick of ``read``, from what it holds on, on a connection of the
        paging pool; ``rows``: no more than that many events."""
        assert self.paging is not None
        left = rows
        end = read.after.lower
        if read.events:  # the tick is bigger than it looked (or than the reader wants): the rest in pages
            position = Position(position.lower, max(position.floor, read.events[-1].offset))
            taken = len(read.events)
            yield read.take(), position
            if left is not None:
                left -= taken
                if left <= 0:
                    return

        def page_rows() -> int:
            return pace.page_rows(left)

        async with self.paging.acquire() as conn, tick_cursor(conn, stream, position, end) as fetch:
            while True:
                want = page_rows()
                page = await fetch(want)
                if page:
                    yield page, Position(position.lower, max(position.floor, page[-1].offset))
                if len(page) < want:
                    break
                if left is not None:
                    left -= len(page)
                    if left <= 0:
                        return  # (the caller has all it wanted; the rest of the tick stays unread)
        yield [], read.after
        pace.ranged(read.log_events)


@dataclass(slots=True)
class _Range:
    """A range read on the API's pool: its events (all of them when ``complete``; else the first
    of its one tick, whose rest is read in pages), the position after it, its log events."""

    events: list[StreamEvent]
    after: Position
    complete: bool
    log_events: int

    def take(self) -> list[StreamEvent]:
        """The events, no longer held here: a caller that has framed them can let them go
        before it writes the frames."""
        events, self.events = self.events, []
        return events


async def _read_tick(
    conn: asyncpg.Connection, stream: str, position: Position, end: int, log_events: int, rows: int | None
) -> tuple[list[StreamEvent], bool]:
    """The stream's events of the one tick ``end`` after ``position``, expected to come to less than
    HISTORY_BYTES, read on ``conn`` (the API's pool) through a cursor: FIRST_PAGE of them, then as
    many as the bytes of those leave room for, up to the tick's log events (so, mostly, two
    fetches). It stops, if the tick turns out bigger (``rows`` events, or HISTORY_BYTES of
    payloads), with False: the caller reads the rest in pages, on a connection of its own. A
    tick of 2,000 events of 50 KB after a stream's small ones was read whole."""
    events: list[StreamEvent] = []
    nbytes = 0
    want = FIRST_PAGE if rows is None else min(FIRST_PAGE, rows)
    async with tick_cursor(conn, stream, position, end) as fetch:
        while True:
            page = await fetch(want)
            events += page
            nbytes += sum(len(e.payload.text) for e in page) + EVENT_BYTES * len(page)
            if len(page) < want:
                return events, True
            if nbytes >= HISTORY_BYTES or (rows is not None and len(events) >= rows):
                return events, False
            room = int((HISTORY_BYTES - nbytes) / (nbytes / len(events))) + 1
            want = max(1, min(room, log_events - len(events) + 1, MAX_PAGE))
            if rows is not None:
                want = min(want, rows - len(events))


def resume_point(position: Position) -> Offset:
    """The offset a reader at ``position`` that got none of its stream's events resumes after: the
    end of tick ``position.lower``, so that the next read does not read that part of the log again."""
    return max(position.floor, Offset(position.lower, 0))
