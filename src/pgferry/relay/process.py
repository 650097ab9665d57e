"""Wiring of the relay process (`pgferry run`): checks, the ticker, delivery, shutdown."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg

from pgferry import db, sql
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpSender
from pgferry.delivery.worker import DeliveryContext
from pgferry.log.ticker import Ticker, TickerSettings
from pgferry.relay.leader import TICKER_LOCK, lead
from pgferry.relay.ownership import Ownership, OwnershipSettings
from pgferry.schema import check_installed

log = logging.getLogger(__name__)


@dataclass
class RelaySettings:
    ticker: TickerSettings = field(default_factory=TickerSettings)
    ownership: OwnershipSettings = field(default_factory=OwnershipSettings)
    leader_retry_interval: float = 1.0
    deliver: bool = True
    #: requests in flight across every subscription of this relay
    max_in_flight: int = 1024
    #: keep-alive connections per endpoint
    pool_size: int = 64
    db_pool_size: int = 10
    #: deadlines for silent database connections (see db.Liveness)
    liveness: db.Liveness = field(default_factory=db.Liveness)

    def __post_init__(self) -> None:
        live = self.liveness
        # PostgreSQL ends lock-holding sessions silent for session_timeout: a healthy
        # relay must speak more often than that, and a cut-off one must stop delivering
        # (command_timeout after its last round) before its locks can pass to another.
        pauses = {
            "ownership claim_interval": self.ownership.claim_interval,
            "ticker idle_interval": self.ticker.idle_interval,
            "leader_retry_interval": self.leader_retry_interval,
        }
        for name, seconds in pauses.items():
            if seconds * 2 >= live.session_timeout:
                raise ValueError(f"{name} ({seconds:g} s) must be under half the session timeout")
        if live.command_timeout + self.ownership.claim_interval >= live.session_timeout:
            raise ValueError("session_timeout must exceed command_timeout + claim_interval")
        if self.ownership.stop_grace >= live.session_timeout:  # the ownership connection waits that long
            raise ValueError("session_timeout must exceed the ownership stop_grace")


class Relay:
    """One relay process. Several may run against one database; one of them ticks."""

    def __init__(self, url: str, settings: RelaySettings | None = None) -> None:
        self.url = url
        self.settings = settings or RelaySettings()
        self.is_ticker = False

    async def check(self) -> int:
        """Fail fast, with the fix in the message, if the database is unusable."""
        conn = await db.connect(self.url, command_timeout=self.settings.liveness.command_timeout)
        try:
            version = await check_installed(conn)
            max_body = await conn.fetchval(sql.query("max_body_bytes"))
        finally:
            await conn.close()
        log.info("connected to %s (schema version %d)", db.redact(self.url), version)
        return int(max_body)

    async def run(self, stop: asyncio.Event) -> None:
        max_body_bytes = await self.check()

        async def tick(conn: asyncpg.Connection, stop: asyncio.Event) -> None:
            await Ticker(conn, self.settings.ticker).run(stop)

        def changed(leading: bool) -> None:
            self.is_ticker = leading

        jobs = [
            lead(
                self.url,
                TICKER_LOCK,
                tick,
                stop,
                name="ticker",
                retry_interval=self.settings.leader_retry_interval,
                on_change=changed,
                liveness=self.settings.liveness,
            )
        ]
        pool = sender = webhooks = None
        if self.settings.deliver:
            # Delivery bookkeeping commits without waiting for its WAL flush: if a
            # crash loses such a commit, the batch's cursor move is lost with it
            # and the batch is sent again (at-least-once, same webhook-ids), so
            # nothing is lost, and a delivery round saves an fsync.
            pool_kwargs = self.settings.liveness.connect_kwargs("pgferry delivery", holds_locks=False)
            pool = await db.create_pool(
                self.url,
                min_size=1,
                max_size=self.settings.db_pool_size,
                server_settings={**pool_kwargs["server_settings"], "synchronous_commit": "off"},
                command_timeout=pool_kwargs["command_timeout"],
            )
            sender = HttpSender(pool_size=self.settings.pool_size)
            webhooks = FastSender(pool_size=self.settings.pool_size)
            ctx = DeliveryContext(
                pool=pool,
                sender=sender,
                webhooks=webhooks,
                global_limit=asyncio.Semaphore(self.settings.max_in_flight),
                max_body_bytes=max_body_bytes,
            )
            jobs.append(Ownership(self.url, ctx, self.settings.ownership, self.settings.liveness).run(stop))
        try:
            await asyncio.gather(*jobs)
        finally:
            if sender is not None:
                await sender.close()
            if webhooks is not None:
                await webhooks.close()
            if pool is not None:
                # close() waits for every connection to be given back; one stuck on a
                # silent network must not keep the process from exiting.
                try:
                    await asyncio.wait_for(pool.close(), self.settings.liveness.command_timeout)
                except TimeoutError:
                    log.warning("delivery: database connections did not close in time; dropping them")
                    pool.terminate()
        log.info("relay stopped")
