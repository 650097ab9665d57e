"""Wiring of the relay process (`pgferry run`): checks, leadership, shutdown."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg

from pgferry import db
from pgferry.log.ticker import Ticker, TickerSettings
from pgferry.relay.leader import TICKER_LOCK, lead
from pgferry.schema import check_installed

log = logging.getLogger(__name__)


@dataclass
class RelaySettings:
    ticker: TickerSettings = field(default_factory=TickerSettings)
    leader_retry_interval: float = 1.0


class Relay:
    """One relay process. Several may run against one database; one of them ticks."""

    def __init__(self, url: str, settings: RelaySettings | None = None) -> None:
        self.url = url
        self.settings = settings or RelaySettings()
        self.is_ticker = False

    async def check(self) -> None:
        """Fail fast, with the fix in the message, if the database is unusable."""
        conn = await db.connect(self.url)
        try:
            version = await check_installed(conn)
        finally:
            await conn.close()
        log.info("connected to %s (schema version %d)", db.redact(self.url), version)

    async def run(self, stop: asyncio.Event) -> None:
        await self.check()

        async def tick(conn: asyncpg.Connection, stop: asyncio.Event) -> None:
            await Ticker(conn, self.settings.ticker).run(stop)

        def changed(leading: bool) -> None:
            self.is_ticker = leading

        await lead(
            self.url,
            TICKER_LOCK,
            tick,
            stop,
            name="ticker",
            retry_interval=self.settings.leader_retry_interval,
            on_change=changed,
        )
        log.info("relay stopped")
