"""The relay's HTTP side: Prometheus metrics and, opt-in, the dashboard.

Both run on the relay's own event loop with aiohttp (already a dependency
for the pg_net sender), each on its own port, bound to 127.0.0.1 unless told
otherwise. They read PostgreSQL through a small pool of their own, so a
scrape or a page view never takes a connection from delivery.

The relay starts them through ``relay/surface.py`` (``OperatorWeb`` is an
``OperatorSurface``) and hands them a ``RelayView``, not itself: this module
depends on the relay's leaf of shared types, the relay does not depend on it.
The dashboard (``ops/dashboard.py``, ``ops/pages.py``) is imported only when its
port is set: a relay serving metrics alone never loads it.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import ClientError, ClientSession, ClientTimeout, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pgferry import db
from pgferry.capture import backfill as backfills
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import PgferryError
from pgferry.ops import inspect
from pgferry.ops.metrics import RelayMetrics, gather_processes
from pgferry.relay.surface import RelayHooks, RelayView, SupervisorView
from pgferry.serving import GuardedRunner

if TYPE_CHECKING:
    from pgferry.ops.dashboard import Dashboard

log = logging.getLogger(__name__)

#: seconds the supervisor's /metrics waits for its children's answers before serving what it has
#: (each child answers from memory, or from a status query of at most a command timeout;
#: Prometheus' default scrape timeout is 10 s)
GATHER_TIMEOUT = 5.0
#: seconds a child's scrape may take in all, finishing after the request that started it
SCRAPE_TIMEOUT = 50.0
#: seconds a child's last metrics stand in for one that did not answer in time: left out, its
#: series vanished from the scrape (a ticker-count alert fired, counters looked reset), which a
#: child rendering ~100K series under load did in 4 of 6 scrapes (outside probe, 2,100
#: subscriptions); pgferry_relay_process_metrics_age_seconds says how old they are.
STALE_LIMIT = 60.0
#: connections the dashboard and the metrics server each hold at most (a browser opens ~6 to a
#: site, a scraper one or two): idle ones from anyone who reaches the port took all the relay's
#: open files, and a webhook was not delivered (outside probe)
DASHBOARD_CONNECTIONS = 32
METRICS_CONNECTIONS = 16


class _Servers:
    """What a relay's and a supervisor's web side share: the listening runners, the dashboard
    and the pool it reads through, started and stopped the same way."""

    def __init__(self) -> None:
        self.runners: list[GuardedRunner] = []
        self.pool: asyncpg.Pool | None = None
        self.dashboard: Dashboard | None = None

    async def _start_dashboard(self, host: str, port: int, token: str | None) -> str:
        """Serves the dashboard (reading through ``self.pool``); returns its URL."""
        # Loaded only when a dashboard port is set: a relay serving metrics alone never imports it.
        from pgferry.ops.dashboard import Dashboard  # noqa: PLC0415 - optional part, loaded only when served

        assert self.pool is not None
        dashboard = Dashboard(self.pool, host=host, token=token)
        self.dashboard = dashboard
        url = await _serve(self.runners, dashboard.app(), host, port, "dashboard", DASHBOARD_CONNECTIONS)
        dashboard.start_sampling()
        log.info("dashboard: serving at %s/%s", url, " (token required)" if token else "")
        return url + "/"

    async def stop(self) -> None:
        if self.dashboard is not None:
            await self.dashboard.stop_sampling()
            self.dashboard = None
        for runner in self.runners:
            await runner.cleanup()
        self.runners.clear()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None


class OperatorWeb(_Servers):
    """The metrics and dashboard servers of one relay run (a ``relay.surface.OperatorSurface``)."""

    def __init__(self, relay: RelayView) -> None:
        super().__init__()
        self.relay = relay
        # Metrics hooks cost a little per event, so they are wired only when served.
        web = relay.web
        self.metrics = (
            RelayMetrics(subscription_histograms=web.metrics_subscription_histograms)
            if web.metrics_port is not None
            else None
        )
        self.hooks = RelayHooks()
        if self.metrics is not None:
            self.hooks = RelayHooks(
                observe_tick=self.metrics.observe_tick,
                observe_wal=self.metrics.observe_wal,
                observe_outcomes=self.metrics.observe_outcomes,
                observe_round=self.metrics.observe_roundtrip("relay_round"),
                observe_withdrawn=self.metrics.observe_withdrawn,
            )
        self._status_lock = asyncio.Lock()

    async def start(self) -> None:
        s = self.relay.web
        if not s.wanted:
            return
        self.pool = await db.create_pool(
            self.relay.url, min_size=1, max_size=3, server_settings={"application_name": "pgferry operator web"}
        )
        if s.metrics_port is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            url = await _serve(self.runners, app, s.metrics_host, s.metrics_port, "metrics", METRICS_CONNECTIONS)
            self.relay.announce("metrics", url + "/metrics")
            log.info("metrics: serving Prometheus metrics at %s/metrics", url)
        if s.dashboard_port is not None:
            self.relay.announce(
                "dashboard", await self._start_dashboard(s.dashboard_host, s.dashboard_port, s.dashboard_token)
            )

    async def _metrics(self, _: web.Request) -> web.Response:
        metrics = self.metrics
        assert metrics is not None and self.pool is not None
        async with self._status_lock:
            if metrics.due_for_refresh():
                try:
                    async with self.pool.acquire() as conn:
                        started = asyncio.get_running_loop().time()
                        rows = await inspect.subscription_status(conn)
                        active = await backfills.listing(conn, finished_within=timedelta(0))
                        retention = await inspect.retention_status(conn)
                        wal = await inspect.wal_status(conn)
                        metrics.db_roundtrip.labels("status").observe(asyncio.get_running_loop().time() - started)
                    metrics.set_status(rows)
                    metrics.set_backfills(active)
                    metrics.set_retention(retention)
                    metrics.set_wal(wal)
                except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                    # Serve what the relay itself counted; the database gauges keep their last values.
                    log.warning("metrics: cannot read subscription status: %s", exc)
        metrics.set_relay(self.relay.is_ticker(), self.relay.in_flight(), self.relay.streams())
        # In a thread (prometheus_client's registry is thread-safe): 73K lines at 1,000 subscriptions
        # take ~0.5 s to render, which held every delivery of the relay's loop.
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _serve(runners: list[GuardedRunner], app: web.Application, host: str, port: int, name: str,
                 max_connections: int) -> str:  # fmt: skip
    runner = GuardedRunner(app, name=name, max_connections=max_connections)
    await runner.setup()
    runners.append(runner)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        raise PgferryError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else bound[0]
    return f"http://{shown}:{bound[1]}"


class SupervisorWeb(_Servers):
    """The metrics and dashboard servers of `pgferry run --processes N`, in the supervisor.

    The dashboard is the same as a relay's: it reads PostgreSQL, where every child
    heartbeats, so it shows the whole set. /metrics asks every running child for its
    metrics (each serves them on a private loopback port) and serves them together,
    each series labelled ``process="SLOT"``, with the supervisor's own counts.
    """

    def __init__(self, supervisor: SupervisorView) -> None:
        super().__init__()
        self.supervisor = supervisor
        self.session: ClientSession | None = None
        #: each child's last answer to /metrics and when (loop time), by slot
        self.last: dict[str, tuple[float, str]] = {}
        #: each child's scrape in progress, by slot (one at a time; it may outlive a request)
        self.scraping: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        s = self.supervisor.web
        if s.metrics_port is not None:
            self.session = ClientSession(timeout=ClientTimeout(total=SCRAPE_TIMEOUT))
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            url = await _serve(self.runners, app, s.metrics_host, s.metrics_port, "metrics", METRICS_CONNECTIONS)
            self.supervisor.announce("metrics", url + "/metrics")
            log.info("metrics: serving the metrics of every relay process at %s/metrics", url)
        if s.dashboard_port is not None:
            self.pool = await db.create_pool(
                self.supervisor.url, min_size=1, max_size=3,
                server_settings={"application_name": "pgferry operator web"},
            )  # fmt: skip
            self.supervisor.announce(
                "dashboard", await self._start_dashboard(s.dashboard_host, s.dashboard_port, s.dashboard_token)
            )

    async def stop(self) -> None:
        for task in self.scraping.values():
            task.cancel()
        await asyncio.gather(*self.scraping.values(), return_exceptions=True)
        if self.session is not None:
            await self.session.close()
            self.session = None
        await super().stop()

    async def _metrics(self, _: web.Request) -> web.Response:
        children = self.supervisor.children()
        self.last = {slot: last for slot, last in self.last.items() if slot in children}
        for slot, url in children.items():  # one scrape of each child at a time, finishing in the background
            if slot not in self.scraping or self.scraping[slot].done():
                self.scraping[slot] = asyncio.create_task(self._scrape(slot, url))
        if children:
            await asyncio.wait([self.scraping[slot] for slot in children], timeout=GATHER_TIMEOUT)
        now = asyncio.get_running_loop().time()
        gathered: dict[str, str] = {}
        ages: dict[str, float] = {}
        for slot in children:
            if (last := self.last.get(slot)) is None or now - last[0] > STALE_LIMIT:
                log.warning("metrics: relay process %s has not answered lately; left out of this scrape", slot)
                continue
            at, gathered[slot] = last
            ages[slot] = now - at
        body = await asyncio.to_thread(gather_processes, gathered, self.supervisor.counts(), ages)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _scrape(self, slot: str, url: str) -> None:
        """One child's metrics into ``last``; a log line if it does not answer (it may be
        restarting). An answer that comes after GATHER_TIMEOUT still counts, for the next scrape:
        thrown away, a child that always took longer aged out of every scrape (outside probe:
        5.8 and 7.6 s at 2,100 subscriptions)."""
        assert self.session is not None
        try:
            async with self.session.get(url) as response:
                response.raise_for_status()
                text = await response.text()
        except (ClientError, TimeoutError) as exc:
            log.warning("metrics: relay process at %s did not answer (%s)", url, exc)
            return
        self.last[slot] = (asyncio.get_running_loop().time(), text)
