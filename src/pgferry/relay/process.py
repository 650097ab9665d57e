"""Wiring of the relay process (`pgferry run`): checks, the ticker, delivery, shutdown."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg

from pgferry import db, sql
from pgferry.delivery.addresses import AddressPolicy
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpSender
from pgferry.delivery.worker import DeliveryContext
from pgferry.log.ticker import Ticker, TickerSettings
from pgferry.ops.metrics import RelayMetrics
from pgferry.ops.web import OperatorWeb, check_dashboard_binding
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
    #: where deliveries may connect (SSRF protection); from PGFERRY_STRICT_ADDRESSES/PGFERRY_ALLOW_ADDRESSES
    addresses: AddressPolicy = field(default_factory=AddressPolicy.from_env)
    #: Prometheus metrics at http://metrics_host:metrics_port/metrics (None: off; 0: any free port)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: the web dashboard (None: off; 0: any free port); a token is required off loopback
    dashboard_port: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = None


class Relay:
    """One relay process. Several may run against one database; one of them ticks."""

    def __init__(self, url: str, settings: RelaySettings | None = None) -> None:
        self.url = url
        self.settings = settings or RelaySettings()
        self.is_ticker = False
        self.ownership: Ownership | None = None
        # Metrics hooks cost a little per event, so they are wired only when served.
        self.metrics = RelayMetrics() if self.settings.metrics_port is not None else None
        #: where the metrics and dashboard servers listen, once started ("metrics"/"dashboard" -> URL)
        self.addresses: dict[str, str] = {}
        if self.settings.dashboard_port is not None:
            check_dashboard_binding(self.settings.dashboard_host, self.settings.dashboard_token)

    async def check(self) -> int:
        """Fail fast, with the fix in the message, if the database is unusable."""
        conn = await db.connect(self.url)
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
            observe = self.metrics.observe_tick if self.metrics is not None else None
            await Ticker(conn, self.settings.ticker, observe=observe).run(stop)

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
            )
        ]
        pool = sender = webhooks = None
        if self.settings.deliver:
            # Delivery bookkeeping commits without waiting for its WAL flush: if a
            # crash loses such a commit, the batch's cursor move is lost with it
            # and the batch is sent again (at-least-once, same webhook-ids), so
            # nothing is lost, and a delivery round saves an fsync.
            pool = await db.create_pool(
                self.url,
                min_size=1,
                max_size=self.settings.db_pool_size,
                server_settings={"application_name": "pgferry delivery", "synchronous_commit": "off"},
                stateless=True,
            )
            policy = self.settings.addresses
            log.info("delivery: %s", policy.describe())
            sender = HttpSender(pool_size=self.settings.pool_size, policy=policy)
            webhooks = FastSender(pool_size=self.settings.pool_size, policy=policy)
            ctx = DeliveryContext(
                pool=pool,
                sender=sender,
                webhooks=webhooks,
                global_limit=asyncio.Semaphore(self.settings.max_in_flight),
                max_body_bytes=max_body_bytes,
                observe=self.metrics.observe_outcomes if self.metrics is not None else None,
            )
            self.ownership = Ownership(self.url, ctx, self.settings.ownership)
            if self.metrics is not None:
                self.ownership.observe_round = self.metrics.observe_roundtrip("relay_round")
            jobs.append(self.ownership.run(stop))
        web = OperatorWeb(self)
        try:
            try:
                await web.start()
            except BaseException:
                for job in jobs:  # never started: close them so none is left un-awaited
                    job.close()
                raise
            await asyncio.gather(*jobs)
        finally:
            await web.stop()
            if sender is not None:
                await sender.close()
            if webhooks is not None:
                await webhooks.close()
            if pool is not None:
                await pool.close()
        log.info("relay stopped")
