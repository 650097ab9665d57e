"""Reading one stream for the Python API: its history from an offset, then live, until its end.

Nothing is registered: no consumer row, no lock, no retention pin, so an
abandoned reader costs nothing (and an offset older than what retention kept
fails with ``OffsetExpired``, which says the oldest offset still there).
The reader reads the log in ranges of ticks (about ``max_events`` events of
the whole log each), keeps its stream's events, gives each its commit tick
(``offsets.commit_ticks``) and yields them in offset order. Once it has read
up to the newest tick it waits for the ticker's notification, or polls every
``poll_interval`` seconds should one be missed. It stops after the stream's
end marker (``ferry.close_stream``).

History is found by reading the log's ranges and filtering by stream, not
through an index on (stream): such an index would cost every writer (measured
in docs/benchmarks.md, "pgferry bench stream-writes"), while a reader's history is read once.
A reader from the beginning starts at the tick the stream catalog gives for
the stream's first event (migration 0010), not at the oldest retained one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import DatabaseUnreachable, PermissionDenied, PgferryError
from pgferry.log.reader import TICK_CHANNEL
from pgferry.log.ticks import Snapshot, commit_ticks, range_ticks
from pgferry.streams.offsets import Offset

log = logging.getLogger(__name__)

#: The header of the event ferry.close_stream appends: the stream ends there.
END_HEADER = "pgferry-control"
#: SQLSTATE of "tick no longer retained" (ferry._batch_end).
_GONE = "55000"


class OffsetExpired(PgferryError):
    """The offset is older than what the log still holds."""

    def __init__(self, offset: Offset, oldest: Offset) -> None:
        super().__init__(
            f"offset {offset} is older than the oldest retained, {oldest}: read again from there "
            "(what lay between was dropped by retention)"
        )
        self.offset = offset
        self.oldest = oldest


class OffsetAhead(PgferryError):
    """The offset is past the newest tick: no reader of this database was ever given it."""

    def __init__(self, offset: Offset, newest: Offset) -> None:
        super().__init__(
            f"offset {offset} is ahead of this database's log (its newest position is {newest}): it was "
            "not given out here, or the database was restored from an older backup since. Read from the "
            "start, or from the newest position to skip what is there"
        )
        self.offset = offset
        self.newest = newest


class JsonText:
    """A payload as the JSON text PostgreSQL holds, for the HTTP API to write out as it is:
    decoding 1,000,000 payloads only to encode them again took a fifth of a catch-up's time."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


#: What a payload read as JSON text becomes: ``JsonText`` (the HTTP API) or its decoded value.
Payload = Callable[[str], Any]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    offset: Offset
    stream: str
    key: str | None
    payload: Any
    headers: dict[str, Any] | None
    created_at: datetime

    @property
    def id(self) -> int:
        return self.offset.id


def setter(event: asyncio.Event) -> Callable[..., None]:
    return lambda *_: event.set()


def is_end(headers: dict[str, Any] | None) -> bool:
    """Whether an event is a stream's end marker (whose headers are a small object: headers nested
    too deep to decode come as RawJSON text, which failed here, in every reader of the stream)."""
    return isinstance(headers, dict) and headers.get(END_HEADER) == "end"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a reader is: it has read every event committed up to tick ``lower``, and of those
    it yields only the ones after ``floor``."""

    lower: int
    floor: Offset


async def start(conn: asyncpg.Connection, stream: str, after: Offset | None) -> Position | None:
    """The position to read ``stream`` ``after`` an offset from (None: from its first retained event,
    which the stream catalog says where to look for), in one round trip. None when there is nothing
    to read and nothing will come: ``after`` is the stream's end marker, or the stream was closed
    and retention has dropped all of it, end marker included."""
    row = await conn.fetchrow(sql.query("stream_start"), stream, after.tick if after is not None else None)
    assert row is not None
    oldest = int(row["oldest"])
    if after is None:
        if row["dropped"]:
            return None
        first = int(row["first_tick"])
        return Position(first, Offset(first, 0))
    if after.id == row["end_event"]:
        return None
    if after.tick < oldest:
        raise OffsetExpired(after, Offset(oldest, 0))
    if row["newest"] is not None and after.tick > row["newest"]:
        # Waiting for that tick would skip every event committed until then, unseen.
        raise OffsetAhead(after, Offset(int(row["newest"]), 0))
    if after.tick == oldest:
        return Position(oldest, after)
    if row["tick_before"] is None:  # no retained tick before it: read from it
        return Position(after.tick, after)
    return Position(int(row["tick_before"]), after)


async def read_range(
    conn: asyncpg.Connection, stream: str, position: Position, max_events: int
) -> tuple[list[StreamEvent], Position] | None:
    """The stream's events in the next range after ``position`` (offset order), and the position
    after it; None when there is no newer tick yet."""
    end = await range_end(conn, position, max_events)
    if end is None:
        return None
    # Decoded here, from the text the HTTP API writes out as it is: as fast as the jsonb codec
    # (orjson either way), and with the decoder passed down, not a second StreamEvent per event.
    return await read_range_to(conn, stream, position, end, payload=db.json_value), Position(end, position.floor)


async def range_end(conn: asyncpg.Connection, position: Position, max_events: int) -> int | None:
    """The tick the next range after ``position`` ends at (about ``max_events`` log events, at
    least one tick); None when there is no newer tick yet. OffsetExpired if it is gone."""
    try:
        end = await conn.fetchval(sql.query("stream_range_end"), position.lower, max_events)
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != _GONE:
            raise
        oldest = int(await conn.fetchval(sql.query("stream_oldest_tick")))
        raise OffsetExpired(position.floor, Offset(oldest, 0)) from None
    return None if end is None else int(end)


async def read_range_to(
    conn: asyncpg.Connection, stream: str, position: Position, end: int, *, payload: Payload = JsonText
) -> list[StreamEvent]:
    """The stream's events after ``position`` committed up to tick ``end``, in offset order, each
    payload made from its JSON text by ``payload`` (``JsonText``: kept as it is)."""
    rows = await conn.fetch(sql.query("stream_events"), position.lower, end, stream)
    if not rows:
        return []
    read = events_of(rows, await range_ticks(conn, position.lower, end), end, payload=payload)
    return sorted((e for e in read if e.offset > position.floor), key=lambda e: e.offset)


@contextlib.asynccontextmanager
async def tick_cursor(
    conn: asyncpg.Connection, stream: str, position: Position, end: int
) -> AsyncIterator[Callable[[int], Awaitable[list[StreamEvent]]]]:
    """``fetch(n)``: the next ``n`` of the stream's events after ``position`` of the one tick ``end``
    (the range (position.lower, end] holds no other), fewer at the last, through a cursor in a
    transaction of ``conn`` that lasts as long as the block. One tick cannot be cut by
    ``max_events``, and read whole, one transaction of 2,000 events of 50 KB held ~100 MB per
    reader catching up (outside probe). Within one tick, id order is commit order, so a floor
    inside the tick is an id to read after, in the query. Payloads come as ``JsonText`` (for
    the HTTP API)."""
    floor = position.floor
    async with conn.transaction():
        if floor.tick > end:  # every event of the tick is before the floor

            async def nothing(n: int) -> list[StreamEvent]:
                return []

            yield nothing
            return
        after_id = floor.id if floor.tick == end else 0
        cursor = await conn.cursor(sql.query("stream_events_by_id"), position.lower, end, stream, after_id)

        async def fetch(n: int) -> list[StreamEvent]:
            return [StreamEvent(Offset(end, r["id"]), stream, r["key"], JsonText(r["payload"]), r["headers"],
                                r["created_at"]) for r in await cursor.fetch(n)]  # fmt: skip

        yield fetch


def events_of(
    rows: Sequence[asyncpg.Record], ticks: list[tuple[int, Snapshot]], end: int, *, payload: Payload = JsonText
) -> list[StreamEvent]:
    """The log rows of a range ending at tick ``end`` (payloads as text) as events, each offset at
    the tick its transaction committed in (in the rows' order), each payload made by ``payload``."""
    commits = commit_ticks([r["txid"] for r in rows], ticks)
    return [
        StreamEvent(
            Offset(end if tick is None else tick, r["id"]),
            r["stream"],
            r["key"],
            payload(r["payload"]),
            r["headers"],
            r["created_at"],
        )
        for r, tick in zip(rows, commits, strict=True)
    ]


async def read_stream(
    url: str,
    stream: str,
    after: Offset | str | None = None,
    *,
    poll_interval: float = 1.0,
    max_events: int = 10_000,
    max_backoff: float = 10.0,
) -> AsyncIterator[StreamEvent]:
    """Yield ``stream``'s events after ``after`` in commit order, follow it live, stop at its end."""
    if not stream:  # no event has an empty stream name: it waited forever (outside probe)
        raise PgferryError("stream must be a non-empty name")
    floor = Offset.parse(after) if isinstance(after, str) else after
    position: Position | None = None
    failures = 0
    while True:
        try:
            conn = await db.connect(
                url, server_settings={"application_name": "pgferry stream reader", **db.LOG_READER_SETTINGS}
            )
        except DatabaseUnreachable:
            if position is None:
                raise
            failures += 1
            await asyncio.sleep(backoff_delay(failures, cap=max_backoff))
            continue
        try:
            wake = asyncio.Event()
            await conn.add_listener(TICK_CHANNEL, setter(wake))
            if position is None:
                position = await start(conn, stream, floor)
                if position is None:
                    return  # closed, and dropped by retention since
            failures = 0
            while True:
                wake.clear()
                read = await read_range(conn, stream, position, max_events)
                if read is None:
                    await wait_for_event(wake, poll_interval)
                    continue
                events, position = read
                for event in events:
                    if is_end(event.headers):
                        return
                    position = Position(position.lower, event.offset)
                    yield event
        except asyncpg.InsufficientPrivilegeError as exc:  # it was this error, raw (outside probe)
            raise PermissionDenied(
                f"{exc.message}: reading a stream reads the log, which takes the ferry_relay role; "
                "ferry_writer may publish and close streams but not read them: `grant ferry_relay to` the "
                "role of the database URL (docs/security.md, Privileges)",
                exc,
            ) from None
        except CONNECTION_ERRORS as exc:
            failures += 1
            log.warning("stream reader of %s lost its database connection (%s); reconnecting", stream, exc)
            await asyncio.sleep(backoff_delay(failures, cap=max_backoff))
        finally:
            if not conn.is_closed():
                conn.terminate()
