"""The relay's HTTP side: Prometheus metrics and, opt-in, the dashboard.

Both run on the relay's own event loop with aiohttp (already a dependency
for the pg_net sender), each on its own port, bound to 127.0.0.1 unless told
otherwise. They read PostgreSQL through a small pool of their own, so a
scrape or a page view never takes a connection from delivery.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pgferry import db
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import PgferryError
from pgferry.ops import inspect

if TYPE_CHECKING:
    from pgferry.ops.dashboard import Dashboard
    from pgferry.relay.process import Relay

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_dashboard_binding(host: str, token: str | None) -> None:
    """The dashboard can pause, resume and replay: off loopback it must not be open to anyone."""
    if not is_loopback(host) and not token:
        raise PgferryError(
            f"the dashboard would listen on {host}, which is not loopback: give --dashboard-token "
            "(or PGFERRY_DASHBOARD_TOKEN) so that only holders of the token can use it"
        )


class OperatorWeb:
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.pool: asyncpg.Pool | None = None
        self.runners: list[web.AppRunner] = []
        self.dashboard: Dashboard | None = None
        self._status_lock = asyncio.Lock()

    @property
    def wanted(self) -> bool:
        s = self.relay.settings
        return s.metrics_port is not None or s.dashboard_port is not None

    async def start(self) -> None:
        if not self.wanted:
            return
        s = self.relay.settings
        self.pool = await db.create_pool(
            self.relay.url, min_size=1, max_size=3, server_settings={"application_name": "pgferry operator web"}
        )
        if s.metrics_port is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            url = await self._serve(app, s.metrics_host, s.metrics_port)
            self.relay.addresses["metrics"] = url + "/metrics"
            log.info("metrics: serving Prometheus metrics at %s/metrics", url)
        if s.dashboard_port is not None:
            from pgferry.ops.dashboard import Dashboard

            dashboard = Dashboard(self.pool, host=s.dashboard_host, token=s.dashboard_token)
            self.dashboard = dashboard
            url = await self._serve(dashboard.app(), s.dashboard_host, s.dashboard_port)
            dashboard.start_sampling()
            self.relay.addresses["dashboard"] = url + "/"
            log.info("dashboard: serving at %s/%s", url, " (token required)" if s.dashboard_token else "")

    async def _serve(self, app: web.Application, host: str, port: int) -> str:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self.runners.append(runner)
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise PgferryError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else bound[0]
        return f"http://{shown}:{bound[1]}"

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

    async def _metrics(self, _: web.Request) -> web.Response:
        metrics = self.relay.metrics
        assert metrics is not None and self.pool is not None
        async with self._status_lock:
            if metrics.due_for_refresh():
                try:
                    async with self.pool.acquire() as conn:
                        started = asyncio.get_running_loop().time()
                        rows = await inspect.subscription_status(conn)
                        metrics.db_roundtrip.labels("status").observe(asyncio.get_running_loop().time() - started)
                    metrics.set_status(rows)
                except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                    # Serve what the relay itself counted; the database gauges keep their last values.
                    log.warning("metrics: cannot read subscription status: %s", exc)
        ownership = self.relay.ownership
        metrics.set_relay(self.relay.is_ticker, ownership.in_flight() if ownership is not None else {})
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
