"""Fan-out: the relay reads the log once per tick and hands each stream's events to every client
that follows it, from memory, so database load does not grow with the number of clients.

A client (an SSE connection, a long-poll) first catches up on history by itself
(``streams.history``, in ranges of the log), then joins the hub's live feed.
The hand-over leaves no gap and no duplicate without any locking: the hub
reads a range (``lower``, ``end``], and only then, in one step of the event
loop, hands its events to the followers and moves ``lower`` to ``end``. A
client that has read history up to the hub's ``lower`` joins in that same
loop step (``join`` checks it), so the next range the hub reads is exactly
the next one the client needs; a client still behind reads on from history.

Each follower has a bounded queue of events. One that more events come for
than it holds (a burst in one tick, or a client reading slower than its
stream is written) is marked ``overflowed`` and dropped from the live feed:
its client is sent what was queued, then reads on from the log where it got
to, on the same connection, until it catches up and joins again. So it loses
nothing, and it can never make the relay hold an unbounded backlog for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from dataclasses import dataclass, field

import asyncpg

from pgferry import db, sql
from pgferry.aio import wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.log.reader import TICK_CHANNEL
from pgferry.log.ticks import Snapshot, range_ticks
from pgferry.streams.offsets import Offset
from pgferry.streams.reader import StreamEvent, events_of, is_end, setter

log = logging.getLogger(__name__)

#: Events of the whole log read per range (the hub's and the catch-ups').
RANGE_EVENTS = 10_000


@dataclass(eq=False)
class Follower:
    """One client following one stream live; ``frames`` fills as events come, up to ``limit``."""

    stream: str
    limit: int
    after: Offset
    queue: deque[StreamEvent] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    ended: bool = False

    def offer(self, events: list[StreamEvent]) -> None:
        for event in events:
            if self.overflowed or self.ended:
                break
            if event.offset <= self.after:
                continue
            if len(self.queue) >= self.limit:
                self.overflowed = True
                break
            self.queue.append(event)
            if is_end(event.headers):
                self.ended = True
        self.wake.set()


@dataclass
class HubStats:
    ranges_read: int = 0
    events_read: int = 0
    #: database round trips of the live feed (the same whatever the number of followers)
    queries: int = 0
    frames_handed: int = 0


class StreamHub:
    """The live feed of every stream some client follows, for one relay."""

    def __init__(self, url: str, *, poll_interval: float = 1.0, range_events: int = RANGE_EVENTS) -> None:
        self.url = url
        self.poll_interval = poll_interval
        self.range_events = range_events
        self.followers: dict[str, set[Follower]] = defaultdict(set)
        #: every event committed up to this tick has been handed out
        self.lower: int | None = None
        self.ready = asyncio.Event()
        self.stats = HubStats()

    def join(self, follower: Follower, read_up_to: int) -> bool:
        """Join the live feed, if ``read_up_to`` (the tick the follower read history up to)
        is where the feed is; else False: read more history first."""
        if self.lower is None or read_up_to < self.lower:
            return False
        self.followers[follower.stream].add(follower)
        return True

    def leave(self, follower: Follower) -> None:
        followers = self.followers.get(follower.stream)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self.followers[follower.stream]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                conn = await db.connect(
                    self.url, server_settings={"application_name": "pgferry stream hub", **db.LOG_READER_SETTINGS}
                )
            except CONNECTION_ERRORS as exc:
                log.warning("stream hub: cannot connect (%s); retrying", exc)
                await wait_for_event(stop, self.poll_interval)
                continue
            try:
                wake = asyncio.Event()
                await conn.add_listener(TICK_CHANNEL, setter(wake))
                if self.lower is None:
                    self.lower = int(await conn.fetchval(sql.query("latest_tick")))
                    self.ready.set()
                while not stop.is_set():
                    wake.clear()
                    if not await self._step(conn):
                        await wait_for_event(wake, self.poll_interval)
            except CONNECTION_ERRORS as exc:
                log.warning("stream hub: lost its database connection (%s); reconnecting", exc)
                await wait_for_event(stop, self.poll_interval)
            finally:
                if not conn.is_closed():
                    conn.terminate()

    async def _step(self, conn: asyncpg.Connection) -> bool:
        """Read and hand out the next range; False when there is no newer tick."""
        assert self.lower is not None
        lower = self.lower
        if not self.followers:  # nobody follows anything: move on without reading events
            newest = await conn.fetchval(sql.query("latest_tick"))
            self.stats.queries += 1
            if newest is None or newest <= lower:
                return False
            if not self.followers:  # nobody joined meanwhile either
                self.lower = int(newest)
            return True
        end = await conn.fetchval(sql.query("stream_range_end"), lower, self.range_events)
        if end is None:
            return False
        # Followers may join during any await below (``join`` only checks ``lower``): the range is
        # read for every stream followed by the time it is handed out, in one loop step after the
        # last await.
        streams: set[str] = set()
        rows: list[asyncpg.Record] = []
        ticks: list[tuple[int, Snapshot]] | None = None
        reads = 1
        while True:
            if late := set(self.followers) - streams:
                streams |= late
                rows += await conn.fetch(sql.query("streams_events"), lower, end, list(late))
            elif rows and ticks is None:
                ticks = await range_ticks(conn, lower, end)
            else:
                break
            reads += 1
        events: dict[str, list[StreamEvent]] = defaultdict(list)
        if rows:
            assert ticks is not None
            for event in events_of(rows, ticks, end):
                events[event.stream].append(event)
        self.stats.ranges_read += 1
        self.stats.events_read += len(rows)
        self.stats.queries += reads
        # One loop step from here on: hand out, then move on (``join`` relies on it).
        for stream, stream_events in events.items():
            stream_events.sort(key=lambda e: e.offset)
            for follower in list(self.followers.get(stream, ())):
                follower.offer(stream_events)
                self.stats.frames_handed += len(stream_events)
                if follower.overflowed or follower.ended:
                    self.leave(follower)  # it gets nothing more
        self.lower = int(end)
        return True
