"""The ticker: turns "something committed" into ticks, at most one NOTIFY each.

Writers never notify. The ticker polls ``ferry.tick()``, which records a
snapshot only when an event committed since the previous tick. Polling is
fast while events flow and backs off while idle, so an idle relay costs a
couple of queries per second and a busy one ticks every few milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from pgferry import sql
from pgferry.aio import wait_for_event

log = logging.getLogger(__name__)

#: How ferry.maintain starts the lines an operator must see (migration 0014).
RETENTION_WARNINGS = ("warning:", "stalled:", "gap:")


@dataclass
class TickerSettings:
    busy_interval: float = 0.01
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
                await self.maintain()
                next_maintenance = now + s.maintain_every
            if now >= next_report:
                if self.ticks > reported:
                    log.info("ticker: %d ticks in the last %.0f s", self.ticks - reported, s.report_every)
                reported, next_report = self.ticks, now + s.report_every
            started = time.perf_counter()
            row = await self.conn.fetchrow(sql.query("tick"))
            if self.observe is not None:
                self.observe(time.perf_counter() - started, row is not None)
            if row is not None:
                self.ticks += 1
            # Only a tick that carried news makes the ticker look again soon;
            # the periodic idle tick does not.
            if row is not None and not row["idle"]:
                interval = s.busy_interval
            else:
                interval = min(interval * s.backoff, s.idle_interval)
            await wait_for_event(stop, interval)

    async def maintain(self) -> None:
        """Housekeeping, logging what it did; what the retention limit did to a consumer (a warning
        at 50% or 80% of it, a stall, a gap) at WARNING, everything else at INFO."""
        for what in await self.conn.fetchval(sql.query("housekeeping")) or ():
            level = logging.WARNING if what.startswith(RETENTION_WARNINGS) else logging.INFO
            log.log(level, "retention: %s", what)
