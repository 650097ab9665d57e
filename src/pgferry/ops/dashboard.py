"""A small web dashboard served by the relay (`pgferry run --dashboard-port`): routes,
sampling and access control; the HTML is rendered by ``ops/pages.py``.

Pages: subscriptions with lag and rate charts (from samples this relay keeps
in memory), relays and recent failures with their last response; one
subscription with its dead letters; an event's trace. Buttons pause, resume
and replay.

Safety: bound to 127.0.0.1 by default, where it only answers requests whose
Host is a loopback name (so a web page cannot reach it through DNS
rebinding); anywhere else a token is required (Authorization: Bearer, or
once as ?token=..., which sets an HttpOnly SameSite=Strict cookie). Every
button posts a per-process CSRF token. Everything shown is HTML-escaped:
response bodies come from receivers and may say anything.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import asyncpg
from aiohttp import web

from pgferry import sql
from pgferry.capture import backfill as backfills
from pgferry.db import CONNECTION_ERRORS, describe
from pgferry.errors import PgferryError
from pgferry.ops import inspect, pages
from pgferry.ops.pages import Sample
from pgferry.relay.surface import is_loopback
from pgferry.serving import BODY_TIMEOUT, is_loopback_name

log = logging.getLogger(__name__)

COOKIE = "pgferry_dashboard"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Sampling waits this many times as long as a sample took (Dashboard.pause_after).
SAMPLING_SHARE = 10.0
#: the largest event id (ferry.events.id is a bigint)
MAX_EVENT_ID = 2**63 - 1
NOT_AN_EVENT_ID = f"an event id is a number from 0 to {MAX_EVENT_ID}"


class Dashboard:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        sample_interval: float = 2.0,
        history: int = 180,
    ) -> None:
        self.pool = pool
        self.token = token
        self.loopback_only = is_loopback(host)
        self.csrf = secrets.token_urlsafe(24)
        self.sample_interval = sample_interval
        self.samples: dict[str, deque[Sample]] = {}
        self.history = history
        self.replays: dict[str, str] = {}
        self.flashes: OrderedDict[str, str] = OrderedDict()
        self._sampler: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_response_prepare.append(_security_headers)
        app.router.add_get("/", self.overview)
        app.router.add_get("/subscriptions/{name}", self.subscription)
        app.router.add_post("/subscriptions/{name}/{action}", self.act)
        app.router.add_get("/events", self.find_event)
        app.router.add_get("/events/{id}", self.event)
        return app

    def start_sampling(self) -> None:
        self._sampler = asyncio.create_task(self._sample_forever(), name="dashboard samples")

    async def stop_sampling(self) -> None:
        tasks = [t for t in (self._sampler, *self._jobs) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.debug("dashboard: sampling failed: %s", exc)
            await asyncio.sleep(self.pause_after(time.monotonic() - started))

    def pause_after(self, took: float) -> float:
        """Seconds to the next sample after one that took ``took``: sample_interval, or long enough
        that sampling keeps the database busy a tenth of the time at most (it runs whether anyone
        looks or not, and one of 3,000 subscriptions took 7-15 s: half a core for nobody; outside
        probe)."""
        return max(self.sample_interval, SAMPLING_SHARE * took)

    async def sample(self) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            rows = await inspect.subscription_status(conn)
        now = time.time()
        for row in rows:
            series = self.samples.setdefault(row["name"], deque(maxlen=self.history))
            series.append(Sample(now, row["lag_events"] or 0, row["lag_seconds"] or 0, row["rate_per_s"]))
        for gone in set(self.samples) - {r["name"] for r in rows}:
            del self.samples[gone]
        return rows

    # -- access control ----------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.loopback_only and not is_loopback_name(request.url.host or ""):
            return web.Response(status=403, text="this dashboard answers only to loopback host names")
        if self.token is not None and not self._authorized(request):
            offered = request.query.get("token")
            if offered is not None and hmac.compare_digest(offered, self.token) and request.method == "GET":
                query = {k: v for k, v in request.query.items() if k != "token"}
                target = request.path + (f"?{urlencode(query)}" if query else "")
                response = web.Response(status=303, headers={"Location": target})
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
                return response
            return web.Response(status=401, content_type="text/html", text=pages.token_page())
        if request.method == "POST" and (refused := await self._check_form(request)) is not None:
            return refused
        try:
            return await handler(request)
        except CONNECTION_ERRORS as exc:  # the database is down: was a bare 500 and a traceback (outside review)
            log.debug("dashboard: %s %s: database unreachable: %s", request.method, request.path, describe(exc))
            return _html(pages.unavailable_page(describe(exc)), status=503)

    async def _check_form(self, request: web.Request) -> web.Response | None:
        """None when a POST's form came in time with this process's CSRF token, else the answer."""
        try:
            async with asyncio.timeout(BODY_TIMEOUT):  # a form promised and never sent held on for good
                form = await request.post()
        except TimeoutError:
            return web.Response(status=408, text=f"the form did not arrive within {BODY_TIMEOUT:g} s")
        if not hmac.compare_digest(str(form.get("csrf", "")), self.csrf):
            return web.Response(status=403, text="stale or missing form token; reload the page")
        return None

    def _authorized(self, request: web.Request) -> bool:
        assert self.token is not None
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:], self.token):
            return True
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and hmac.compare_digest(cookie, self.token)

    # -- pages --------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        async with self.pool.acquire() as conn:
            rows = await inspect.subscription_status(conn)
            relays = await inspect.relays(conn)
            failures = await inspect.recent_failures(conn, None, 20)
            active = await backfills.listing(conn)
            behind = inspect.holding_back(await inspect.retention_status(conn))
            wal = await inspect.wal_status(conn)
        return _html(
            pages.overview_page(
                self._flash(request),
                rows,
                failures,
                relays,
                self.samples,
                self._controls(),
                active,
                behind,
                wal,
                pages.Listing.from_query(request.query),
            )
        )

    async def subscription(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.pool.acquire() as conn:
            rows = [r for r in await inspect.subscription_status(conn) if r["name"] == name]
            if not rows:
                raise web.HTTPNotFound(text=f"no subscription {name}")
            letters = [dict(r) for r in await conn.fetch(sql.query("dlq_list"), name, 100)]
            failures = await inspect.recent_failures(conn, name, 20)
        series = list(self.samples.get(name, ()))
        page = pages.subscription_page(self._flash(request), rows, letters, failures, series, self._controls())
        return _html(page)

    async def find_event(self, request: web.Request) -> web.StreamResponse:
        event_id = _event_id(request.query.get("id", "").strip().lstrip("#"))
        if event_id is None:
            raise web.HTTPSeeOther("/?" + urlencode({"flash": self._remember(NOT_AN_EVENT_ID)}))
        raise web.HTTPSeeOther(f"/events/{event_id}")

    async def event(self, request: web.Request) -> web.Response:
        raw = request.match_info["id"]
        event_id = _event_id(raw)
        if event_id is None:
            raise web.HTTPNotFound(text=NOT_AN_EVENT_ID)
        try:
            async with self.pool.acquire() as conn:
                result = await inspect.trace(conn, event_id)
        except PgferryError as exc:
            return _html(pages.event_missing_page(raw, str(exc)), status=404)
        return _html(pages.event_page(raw, result.event, result.in_log, result.subscriptions, result.attempts))

    # -- actions ------------------------------------------------------------------

    async def act(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        action = request.match_info["action"]
        form = await request.post()
        back = str(form.get("back") or f"/subscriptions/{quote(name)}")
        if not back.startswith("/") or back.startswith("//") or "\\" in back:
            back = "/"
        try:
            message = await self._do(name, action, form)
        except PgferryError as exc:
            message = str(exc)
        except asyncpg.PostgresError as exc:
            message = f"failed: {exc}"
        path, _, query = back.partition("?")
        kept = [(k, v) for k, v in parse_qsl(query) if k != "flash"]  # the page and filter the button was on
        raise web.HTTPSeeOther(path + "?" + urlencode([*kept, ("flash", self._remember(message))]))

    async def _do(self, name: str, action: str, form: Any) -> str:
        async with self.pool.acquire() as conn:
            if not await conn.fetchval(sql.query("subscription_exists"), name):
                raise PgferryError(f"subscription {name} does not exist")
            if action == "pause":
                await conn.execute(sql.query("pause_subscription"), name)
                return f"{name} paused"
            if action in ("resume", "resume-retained", "resume-now"):
                position = {"resume": None, "resume-retained": "retained", "resume-now": "now"}[action]
                try:
                    await conn.execute(sql.query("resume_subscription"), name, position)
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate in ("55000", "22023"):
                        raise PgferryError(str(exc)) from None
                    raise
                return f"{name} resumed" + (f" from {'the oldest retained event' if position == 'retained' else 'now'}"
                                            if position else "")  # fmt: skip
            if action == "replay-dead":
                n = await conn.fetchval(sql.query("dlq_replay"), name, None)
                return f"{n} dead letter(s) of {name} queued for delivery"
        if action == "replay":
            return self._start_replay(
                name, str(form.get("since") or "").strip(), str(form.get("from_event") or "").strip()
            )
        raise web.HTTPNotFound(text=f"unknown action {action}")

    def _start_replay(self, name: str, since_text: str, from_text: str) -> str:
        from_event = _event_id(from_text) if from_text else None
        if from_text and from_event is None:  # was a replay since 1 h, or a 500 for "²"
            raise PgferryError(f"cannot replay from event {from_text!r}: {NOT_AN_EVENT_ID}")
        since = None
        if from_event is None:
            try:
                since = inspect.parse_since(since_text or "1h")
            except ValueError as exc:
                raise PgferryError(str(exc)) from None

        async def run() -> None:
            queued = skipped = 0
            try:
                async with self.pool.acquire() as conn:
                    async for step in inspect.replay(conn, name, since=since, from_event=from_event):
                        queued += step.queued
                        skipped += step.skipped
                        self.replays[name] = f"replay running: {queued} queued, {skipped} skipped"
                self.replays[name] = f"replay finished: {queued} queued, {skipped} skipped"
            except (PgferryError, asyncpg.PostgresError, OSError) as exc:
                self.replays[name] = f"replay failed: {exc}"

        task = asyncio.create_task(run(), name=f"replay {name}")
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        what = f"from event {from_event}" if from_event is not None else f"since {since:%Y-%m-%d %H:%M:%S %Z}"
        return f"replay of {name} {what} started"

    # -- pieces -------------------------------------------------------------------

    def _flash(self, request: web.Request) -> str | None:
        return self.flashes.get(request.query.get("flash", ""))

    def _remember(self, message: str) -> str:
        """Keep a message for the page redirected to, under a random key: a crafted link cannot make
        the dashboard show text of someone else's choosing."""
        key = secrets.token_urlsafe(9)
        self.flashes[key] = message
        while len(self.flashes) > 100:
            self.flashes.popitem(last=False)
        return key

    def _controls(self) -> pages.Controls:
        return pages.Controls(csrf=self.csrf, replays=self.replays)


def _event_id(text: str) -> int | None:
    """``text`` as an event id, or None: ASCII digits only ("²".isdigit() is true, and int() of it
    failed with a 500) and within bigint (a longer number was a 500 from asyncpg's OverflowError)."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= MAX_EVENT_ID else None


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})


async def _security_headers(_: web.Request, response: web.StreamResponse) -> None:
    """On every answer, errors and the token page too (that page had no X-Frame-Options)."""
    response.headers["Content-Security-Policy"] = pages.CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
