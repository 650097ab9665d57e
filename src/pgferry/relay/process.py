"""Wiring of the relay process (`pgferry run`): checks, the ticker, delivery, shutdown.

The metrics and dashboard servers are the operator side (``ops/web.py``): the
relay starts them through ``relay/surface.py`` and hands them a view of
itself, and loads them only when a port asks for them (``operator_web``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg

from pgferry import db, sql
from pgferry.capture.wal import WalCapture, WalSettings
from pgferry.delivery.addresses import AddressPolicy
from pgferry.delivery.brokers import Brokers
from pgferry.delivery.budget import DEFAULT_MAX_READ_BYTES, MIN_READ_BOUND
from pgferry.delivery.context import DEFAULT_MAX_BATCH_BYTES, PIPELINE_DEPTH, DeliveryContext
from pgferry.delivery.fasthttp import MAX_IDLE, FastSender, tls_context
from pgferry.delivery.in_flight import RelayInFlight
from pgferry.errors import DatabaseUnreachable, PgferryError
from pgferry.limits import FD_RESERVE, raise_open_files
from pgferry.log.ticker import Ticker, TickerSettings
from pgferry.relay.leader import TICKER_LOCK, WAL_CAPTURE_LOCK, lead
from pgferry.relay.ownership import Ownership, OwnershipSettings
from pgferry.relay.surface import (
    OperatorFactory,
    OperatorSurface,
    RelayHooks,
    RelayView,
    WebSettings,
    check_dashboard_binding,
)
from pgferry.schema import check_installed
from pgferry.streams.settings import ApiSettings

if TYPE_CHECKING:
    from pgferry.streams.api import StreamsApi

log = logging.getLogger(__name__)

#: Idle webhook connections kept however low the limit of open files is.
MIN_IDLE = 64


@dataclass
class RelaySettings:
    ticker: TickerSettings = field(default_factory=TickerSettings)
    wal: WalSettings = field(default_factory=WalSettings)
    ownership: OwnershipSettings = field(default_factory=OwnershipSettings)
    leader_retry_interval: float = 1.0
    deliver: bool = True
    #: requests in flight across every subscription of this relay
    max_in_flight: int = 1024
    #: keep-alive connections per endpoint
    pool_size: int = 64
    db_pool_size: int = 10
    #: bytes of events a subscription's reads hold at once (see DeliveryContext.max_batch_bytes)
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: bytes of events every subscription's reads hold at once, together (delivery.budget)
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    #: where deliveries may connect (SSRF protection); from PGFERRY_STRICT_ADDRESSES/PGFERRY_ALLOW_ADDRESSES
    addresses: AddressPolicy = field(default_factory=AddressPolicy.from_env)
    #: PEM file of extra CA certificates trusted for https endpoints (PGFERRY_CA_FILE)
    ca_file: str | None = None
    #: Prometheus metrics at http://metrics_host:metrics_port/metrics (None: off; 0: any free port)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: histograms per subscription (False: one set for the relay; ~50 series each, see ops/metrics.py)
    metrics_subscription_histograms: bool = True
    #: the web dashboard (None: off; 0: any free port); a token is required off loopback
    dashboard_port: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = None
    #: deadlines for silent database connections (see db.Liveness)
    liveness: db.Liveness = field(default_factory=db.Liveness)
    #: the streams HTTP API (None: not served)
    api: ApiSettings | None = None
    #: set in a child of `pgferry run --processes N`: "SUPERVISOR_PID.SLOT", written into its relay
    #: id (host:pid:SUPERVISOR_PID.SLOT:random) so `pgferry status` shows which set a relay belongs to
    group: str | None = None

    def __post_init__(self) -> None:
        if self.max_batch_bytes < PIPELINE_DEPTH + 1:  # each read gets a share; a share of 0 is no bound
            raise ValueError(
                f"max_batch_bytes must be at least {PIPELINE_DEPTH + 1} bytes, got {self.max_batch_bytes} "
                "(it bounds what a subscription holds in memory; e.g. 16MB)"
            )
        if self.max_read_bytes < MIN_READ_BOUND:
            raise ValueError(
                f"max_read_bytes must be at least {MIN_READ_BOUND} bytes (64KB), got {self.max_read_bytes} "
                "(it bounds what all subscriptions' reads hold in memory together; e.g. 64MB)"
            )
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
        if self.ca_file is not None:
            try:
                tls_context(self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot use {self.ca_file} as a CA file (PEM certificates expected): {exc}") from None

    @property
    def web(self) -> WebSettings:
        """The metrics and dashboard settings, as the operator side sees them."""
        return WebSettings(
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host,
            metrics_subscription_histograms=self.metrics_subscription_histograms,
            dashboard_port=self.dashboard_port,
            dashboard_host=self.dashboard_host,
            dashboard_token=self.dashboard_token,
        )


def operator_web() -> OperatorFactory:
    """The default operator side: ops/web.py's metrics and dashboard servers."""
    # The relay's one arrow to ops/, taken only when a metrics or dashboard port is set:
    # without one the relay runs with ops/ (aiohttp, prometheus_client) never imported,
    # and ops/ reaches the relay only through relay/surface.py, never this module, so
    # there is no cycle (tests/test_layout.py holds both).
    from pgferry.ops.web import OperatorWeb  # noqa: PLC0415 - optional part, loaded only when served

    return OperatorWeb


class Relay:
    """One relay process. Several may run against one database; one of them ticks.

    ``operator`` makes the metrics and dashboard servers of a run; by default
    ops/web.py's, when ``settings`` give a port for either.
    """

    def __init__(
        self, url: str, settings: RelaySettings | None = None, *, operator: OperatorFactory | None = None
    ) -> None:
        self.url = url
        self.settings = settings or RelaySettings()
        self.is_ticker = False
        self.ownership: Ownership | None = None
        #: where the metrics and dashboard servers listen, once started ("metrics"/"dashboard" -> URL)
        self.addresses: dict[str, str] = {}
        web = self.settings.web
        if web.dashboard_port is not None:
            check_dashboard_binding(web.dashboard_host, web.dashboard_token)
        #: the streams HTTP API, once served
        self.api: StreamsApi | None = None
        #: also told where a server listens (a supervised child passes its metrics address on)
        self.on_announce: Callable[[str, str], None] | None = None
        self.operator = operator if operator is not None else operator_web() if web.wanted else None

    def in_flight(self) -> dict[str, int]:
        """Requests in flight per subscription this relay delivers."""
        return self.ownership.in_flight() if self.ownership is not None else {}

    def view(self) -> RelayView:
        """What the operator side may see of this relay, and the one thing it may set."""

        def is_ticker() -> bool:
            return self.is_ticker

        return RelayView(
            url=self.url,
            web=self.settings.web,
            is_ticker=is_ticker,
            in_flight=self.in_flight,
            announce=self._announce,
            streams=lambda: self.api.counts() if self.api is not None else {},
        )

    def _announce(self, kind: str, url: str) -> None:
        self.addresses[kind] = url
        if self.on_announce is not None:
            self.on_announce(kind, url)

    async def check(self) -> asyncpg.Record:
        """Fail fast, with the fix in the message, if the database is unusable; else what the relay
        reads once from ferry.config (max_body_bytes, instance)."""
        conn = await db.connect_when_up(self.url, command_timeout=self.settings.liveness.command_timeout)
        try:
            version = await check_installed(conn)
            config = await conn.fetchrow(sql.query("relay_config"))
            not_writable = await conn.fetchval(sql.query("writable_here"))
        except (TimeoutError, *db.CONNECTION_ERRORS) as exc:  # e.g. the server shutting down meanwhile
            raise DatabaseUnreachable(
                f"lost the connection to {db.redact(self.url)} while checking its schema: {db.describe(exc)}"
            ) from exc
        finally:
            with contextlib.suppress(*db.CONNECTION_ERRORS):
                await conn.close()
        if not_writable is not None:  # it connected, then looped on errors forever (outside probe)
            raise PgferryError(f"{db.redact(self.url)}: {db.READ_ONLY_FIX[not_writable]}")
        log.info("connected to %s (schema version %d)", db.redact(self.url), version)
        assert config is not None
        return config

    def _idle_connections(self) -> int:
        """How many idle webhook connections the sender may keep: MAX_IDLE, unless this process's
        limit of open files (raised first) leaves room only for fewer beside max_in_flight
        requests and a reserve for the database, brokers and the API."""
        busy = self.settings.max_in_flight + FD_RESERVE
        soft = raise_open_files("delivery", busy + MAX_IDLE)
        if soft is None or soft >= busy + MAX_IDLE:
            return MAX_IDLE
        idle = max(MIN_IDLE, soft - busy)
        log.warning(
            "delivery: this process may open %d files: keeping %d idle webhook connections, not %d, beside "
            "%d requests in flight; raise the limit (ulimit -n, systemd LimitNOFILE=) for more",
            soft, idle, MAX_IDLE, self.settings.max_in_flight,
        )  # fmt: skip
        return idle

    async def run(self, stop: asyncio.Event) -> None:
        config = await self.check()
        surface: OperatorSurface | None = self.operator(self.view()) if self.operator is not None else None
        hooks = surface.hooks if surface is not None else RelayHooks()

        async def tick(conn: asyncpg.Connection, stop: asyncio.Event) -> None:
            await Ticker(conn, self.settings.ticker, observe=hooks.observe_tick).run(stop)

        async def capture_wal(conn: asyncpg.Connection, stop: asyncio.Event) -> None:
            await WalCapture(conn, self.url, self.settings.wal, observe=hooks.observe_wal).run(stop)

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
            ),
            lead(
                self.url,
                WAL_CAPTURE_LOCK,
                capture_wal,
                stop,
                name="wal capture",
                retry_interval=self.settings.leader_retry_interval,
                liveness=self.settings.liveness,
            ),
        ]
        pool = http = brokers = None
        if self.settings.deliver:
            # Delivery bookkeeping commits without waiting for its WAL flush: if a
            # crash loses such a commit, the batch's cursor move is lost with it
            # and the batch is sent again (at-least-once, same webhook-ids), so
            # nothing is lost, and a delivery round saves an fsync (db.DELIVERY_SETTINGS).
            pool_kwargs = self.settings.liveness.connect_kwargs("pgferry delivery", holds_locks=False)
            pool = await db.create_pool(
                self.url,
                min_size=1,
                max_size=self.settings.db_pool_size,
                server_settings={**pool_kwargs["server_settings"], **db.DELIVERY_SETTINGS},
                command_timeout=self.settings.liveness.delivery_timeout,
                reset=db.rollback_if_open,
            )
            policy = self.settings.addresses
            log.info("delivery: %s", policy.describe())
            tls = tls_context(self.settings.ca_file)
            http = FastSender(pool_size=self.settings.pool_size, policy=policy, tls=tls,
                              max_idle=self._idle_connections())  # fmt: skip
            brokers = Brokers(policy)
            ctx = DeliveryContext(
                pool=pool,
                http=http,
                brokers=brokers,
                global_limit=RelayInFlight(self.settings.max_in_flight),
                max_body_bytes=config["max_body_bytes"],
                instance=config["instance"],
                max_batch_bytes=self.settings.max_batch_bytes,
                max_read_bytes=self.settings.max_read_bytes,
                observe=hooks.observe_outcomes,
                observe_withdrawn=hooks.observe_withdrawn,
            )
            self.ownership = Ownership(self.url, ctx, self.settings.ownership, self.settings.liveness)
            if self.settings.group is not None:
                host, pid, rest = self.ownership.relay_id.rsplit(":", 2)
                self.ownership.relay_id = f"{host}:{pid}:{self.settings.group}:{rest}"
            self.ownership.observe_round = hooks.observe_round
            jobs.append(self.ownership.run(stop))
        if self.settings.api is not None:
            jobs.append(self._serve_api(self.settings.api, stop))
        try:
            try:
                if surface is not None:
                    await surface.start()
            except BaseException:
                for job in jobs:  # never started: close them so none is left un-awaited
                    job.close()
                raise
            await asyncio.gather(*jobs)
        finally:
            if surface is not None:
                await surface.stop()
            if http is not None:
                await http.close()
            if brokers is not None:
                await brokers.close()
            if pool is not None:
                # close() waits for every connection to be given back; one stuck on a
                # silent network must not keep the process from exiting.
                try:
                    await asyncio.wait_for(pool.close(), self.settings.liveness.command_timeout)
                except TimeoutError:
                    log.warning("delivery: database connections did not close in time; dropping them")
                    pool.terminate()
        log.info("relay stopped")

    async def _serve_api(self, settings: ApiSettings, stop: asyncio.Event) -> None:
        # aiohttp's server is loaded only by a relay that serves the API.
        from pgferry.streams.api import StreamsApi, serve  # noqa: PLC0415 - optional part

        api = StreamsApi(self.url, settings)
        self.api = api
        await serve(api, stop, announce=lambda url: self._announce("api", url))
