"""The ticker: turns "something committed" into ticks, at most one NOTIFY each.

Writers never notify. The ticker polls ``ferry._tick_fenced()``, which records a
snapshot only when an event committed since the previous tick. Polling is
fast while events flow and backs off while idle, so an idle relay costs a
couple of queries per second and a busy one ticks every few milliseconds.

While WAL capture runs, a tick waits until the relay has appended every
transaction its snapshot sees committed (``ferry._tick_fenced``, migration
0028): the ticker keeps the *fence* each call returns (the snapshot and the
WAL position it waits for) and passes it back on the next call, which
records the tick once WAL capture is past it. So WAL-captured events share
one commit order with trigger-captured ones and publishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pgferry import sql
from pgferry.aio import wait_for_event
from pgferry.log.timeline import check_timeline

log = logging.getLogger(__name__)

#: The longest the log stays silent about WAL capture falling behind the ticker's wait (it may
#: fall behind and catch up again every few seconds on a loaded machine).
BEHIND_LOG_EVERY = 60.0

#: How ferry.housekeeping starts the lines of ferry.maintain an operator must see (migration 0014).
RETENTION_WARNINGS = ("retention: warning:", "retention: stalled:", "retention: gap:")


@dataclass(frozen=True, slots=True)
class Fence:
    """A snapshot the next tick will have, once WAL capture has appended what it sees committed."""

    snapshot: str
    lsn: str
    #: the newest tick when it was taken: another tick since (a ``ferry.tick()`` by hand) voids it
    tick: int
    taken_at: datetime
    #: when this process first saw it (time.monotonic()): how soon to look again
    seen_at: float = 0.0


@dataclass
class TickerSettings:
    busy_interval: float = 0.01
    #: how soon to look again while a fence waits for WAL capture and events were written since
    #: the last tick: the wait is the latency every event pays while WAL capture runs (bench
    #: capture --only wal, "commit to tick"); a quarter of the fence's age once that is longer
    #: (up to busy_interval), so that a decoder that lags is not also polled at 500/s on the
    #: cores it needs (pinned to one core with the decoder, that doubled its lag). A fence
    #: waiting with nothing written (the cluster's WAL moves with other databases' writes too)
    #: gets the usual backoff.
    fence_interval: float = 0.002
    idle_interval: float = 0.5
    backoff: float = 1.5
    maintain_every: float = 5.0
    report_every: float = 60.0


class Ticker:
    """Runs on the leader's connection until ``stop`` is set or the connection fails."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        settings: TickerSettings | None = None,
        observe: Callable[[float, bool], None] | None = None,
    ) -> None:
        self.conn = conn
        self.settings = settings or TickerSettings()
        self.ticks = 0
        #: the fence the last call returned, passed back on the next one
        self.fence: Fence | None = None
        #: where WAL capture must get to before ticks wait for it again (a fence's wait ran out)
        self.behind: str | None = None
        #: times WAL capture fell behind since the log last said so (once a minute at most)
        self.behind_episodes = 0
        self._behind_said_at = -BEHIND_LOG_EVERY
        #: metrics hook: (seconds the tick query took, whether it made a tick)
        self.observe = observe

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        # A lost tick is harmless (the next one covers its events) and every
        # consumer ack is a synchronous commit that flushes earlier ticks, so
        # ticks need not wait for their own WAL flush.
        await self.conn.execute("set synchronous_commit = off")
        interval = s.busy_interval
        next_maintenance = 0.0
        next_report = time.monotonic() + s.report_every
        reported = 0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_maintenance:
                # Before the first tick: a promoted or restored database moves its ids on first.
                await check_timeline(self.conn)
                await self.maintain()
                next_maintenance = now + s.maintain_every
            if now >= next_report:
                if self.ticks > reported:
                    log.info("ticker: %d ticks in the last %.0f s", self.ticks - reported, s.report_every)
                reported, next_report = self.ticks, now + s.report_every
            started = time.perf_counter()
            ticked, idle, waiting, written = await self.tick()
            if self.observe is not None:
                self.observe(time.perf_counter() - started, ticked)
            if ticked:
                self.ticks += 1
            # Only a tick that carried news makes the ticker look again soon, and
            # sooner while a fence waits for WAL capture after news or with events
            # written since; the periodic idle tick does not.
            if written or (waiting and ticked and not idle):
                waited = time.monotonic() - self.fence.seen_at if self.fence is not None else 0.0
                interval = min(s.busy_interval, max(s.fence_interval, waited / 4))
            elif ticked and not idle:
                interval = s.busy_interval
            else:
                interval = min(max(interval, s.busy_interval) * s.backoff, s.idle_interval)
            await wait_for_event(stop, interval)

    async def tick(self) -> tuple[bool, bool, bool, bool]:
        """One call of ``ferry._tick_fenced``: whether it recorded a tick, whether that tick was
        only an idle one, whether a fence waits for WAL capture, and whether events were written
        since the newest tick while it waits."""
        f = self.fence
        row = await self.conn.fetchrow(
            sql.query("tick"),
            *((f.snapshot, f.lsn, f.tick, f.taken_at) if f is not None else (None, None, None, None)),
            self.behind,
        )
        assert row is not None  # one row, always
        if row["next_behind"] is not None and self.behind is None:
            self.behind_episodes += 1
            if time.monotonic() - self._behind_said_at >= BEHIND_LOG_EVERY:
                self._behind_said_at = time.monotonic()
                log.info("ticker: WAL capture fell more than wal_order_wait behind (%d time(s) since this was last "
                         "said); ticks go on without it until it catches up, and its changes meanwhile come a batch "
                         "later than their commit", self.behind_episodes)  # fmt: skip
                self.behind_episodes = 0
        self.behind = row["next_behind"]
        if row["next_fence"] is None:
            self.fence = None
        elif f is None or row["next_at"] != f.taken_at:
            self.fence = Fence(row["next_fence"], row["next_lsn"], row["next_tick"], row["next_at"], time.monotonic())
        return row["tick_id"] is not None, bool(row["idle"]), bool(row["waiting"]), bool(row["written"])

    async def maintain(self) -> None:
        """Housekeeping, logging what it did; what the retention limit did to a consumer (a warning
        at 50% or 80% of it, a stall, a gap) at WARNING, everything else at INFO."""
        for what in await self.conn.fetchval(sql.query("housekeeping")) or ():  # each line starts with its topic
            level = logging.WARNING if what.startswith(RETENTION_WARNINGS) else logging.INFO
            log.log(level, "%s", what)
