"""A small web dashboard served by the relay (`pgferry run --dashboard-port`).

Server-rendered HTML with a few lines of JavaScript (refresh the live part
every few seconds); no front-end build. Pages: subscriptions with lag and
rate charts (inline SVG from samples this relay keeps in memory), relays and
recent failures with their last response; one subscription with its dead
letters; an event's trace. Buttons pause, resume and replay.

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
import html
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
import orjson
from aiohttp import web

from pgferry import sql
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import PgferryError
from pgferry.ops import inspect
from pgferry.relay.surface import is_loopback

log = logging.getLogger(__name__)

COOKIE = "pgferry_dashboard"
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    lag_events: float
    lag_seconds: float
    rate: float


def esc(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, datetime):
        return f"{value:%Y-%m-%d %H:%M:%S}"
    if isinstance(value, list | tuple):
        return html.escape(", ".join(map(str, value)))
    return html.escape(str(value))


def sparkline(values: list[float], width: int = 160, height: int = 32, label: str = "") -> str:
    """An inline SVG line chart of the samples (newest right), scaled to their maximum."""
    if len(values) < 2:
        return f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{esc(label)}"></svg>'
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    return (
        f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{esc(label)}">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/>'
        f'<text x="{width - 2}" y="10" text-anchor="end">{esc(_num(top))}</text></svg>'
    )


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:1em 1.2em}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.5em;width:100%}
th,td{border-bottom:1px solid #e3e6ea;padding:.35em .6em;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
.ok{color:#137333}.bad{color:#b3261e;font-weight:600}.warn{color:#9a6700}
.spark{color:#3b6fd8;vertical-align:middle}.spark text{font-size:9px;fill:#667}
form.inline{display:inline}button{cursor:pointer;margin:0 .2em .2em 0}
pre{background:#fff;border:1px solid #e3e6ea;padding:.6em;overflow:auto;max-height:20em}
.flash{background:#e8f0fe;border:1px solid #aecbfa;padding:.5em 1em;margin-bottom:1em}
.resp{max-width:30em;overflow-wrap:anywhere;font-family:monospace;font-size:12px}
"""

REFRESH_JS = """
setInterval(async () => {
  if (document.activeElement && document.activeElement.tagName === 'INPUT') return;
  try {
    const r = await fetch(location.href, {credentials: 'same-origin'});
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
    const fresh = doc.getElementById('live'), here = document.getElementById('live');
    if (fresh && here) here.replaceWith(fresh);
  } catch (e) {}
}, 3000);
"""


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
            try:
                await self.sample()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.debug("dashboard: sampling failed: %s", exc)
            await asyncio.sleep(self.sample_interval)

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
        if self.loopback_only and (request.url.host or "") not in LOOPBACK_NAMES:
            return web.Response(status=403, text="this dashboard answers only to loopback host names")
        if self.token is not None and not self._authorized(request):
            offered = request.query.get("token")
            if offered is not None and hmac.compare_digest(offered, self.token) and request.method == "GET":
                query = {k: v for k, v in request.query.items() if k != "token"}
                target = request.path + (f"?{urlencode(query)}" if query else "")
                response = web.Response(status=303, headers={"Location": target})
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
                return response
            return web.Response(
                status=401,
                content_type="text/html",
                text=_page("token required", '<form method="get"><label>Dashboard token '
                           '<input name="token" type="password" autofocus></label> <button>Open</button></form>'),
            )  # fmt: skip
        if request.method == "POST":
            form = await request.post()
            if not hmac.compare_digest(str(form.get("csrf", "")), self.csrf):
                return web.Response(status=403, text="stale or missing form token; reload the page")
        return await handler(request)

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
        body = [self._flash(request), _search_form(), '<div id="live">', "<h2>Subscriptions</h2>"]
        body.append(self._subscriptions_table(rows))
        body.append("<h2>Recent failures</h2>")
        body.append(_failures_table(failures))
        body.append("<h2>Relays</h2>")
        body.append(_relays_table(relays))
        body.append("</div>")
        return _html(_page("pgferry", "".join(body)))

    async def subscription(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.pool.acquire() as conn:
            rows = [r for r in await inspect.subscription_status(conn) if r["name"] == name]
            if not rows:
                raise web.HTTPNotFound(text=f"no subscription {name}")
            letters = [dict(r) for r in await conn.fetch(sql.query("dlq_list"), name, 100)]
            failures = await inspect.recent_failures(conn, name, 20)
        row = rows[0]
        series = list(self.samples.get(name, ()))
        parts = [
            self._flash(request),
            f"<h2>{esc(name)}</h2>",
            f"<p>{esc(row['url'])} · streams {esc(row['streams'])} · state {_state(row['state'])}"
            f"{' (' + esc(row['state_reason']) + ')' if row['state_reason'] else ''} · relay {esc(row['owner'])}</p>",
            f"<p>{self._actions(name, row)}</p>",
            '<div id="live">',
            '<table class="charts"><tr><th>lag (events)</th><th>lag (s)</th><th>delivered per second</th></tr><tr>',
            f"<td>{sparkline([s.lag_events for s in series], 320, 60, 'lag in events')}</td>",
            f"<td>{sparkline([s.lag_seconds for s in series], 320, 60, 'lag in seconds')}</td>",
            f"<td>{sparkline([s.rate for s in series], 320, 60, 'delivery rate')}</td></tr></table>",
            self._subscriptions_table(rows, charts=False),
            f"<h3>Dead letters ({row['dead']})</h3>",
            _letters_table(letters),
            "<h3>Recent failures</h3>",
            _failures_table(failures),
            "</div>",
            _replay_form(name, self.csrf),
        ]
        return _html(_page(f"pgferry · {name}", "".join(parts)))

    async def find_event(self, request: web.Request) -> web.StreamResponse:
        event_id = request.query.get("id", "").strip().lstrip("#")
        if not event_id.isdigit():
            raise web.HTTPSeeOther("/?" + urlencode({"flash": self._remember("an event id is a number")}))
        raise web.HTTPSeeOther(f"/events/{event_id}")

    async def event(self, request: web.Request) -> web.Response:
        raw = request.match_info["id"]
        if not raw.isdigit():
            raise web.HTTPNotFound(text="an event id is a number")
        try:
            async with self.pool.acquire() as conn:
                result = await inspect.trace(conn, int(raw))
        except PgferryError as exc:
            return _html(_page(f"event {raw}", _search_form() + f"<p>{esc(str(exc))}</p>"), status=404)
        parts = [_search_form(), f"<h2>Event {esc(raw)}</h2>"]
        event = result.event
        if event is not None:
            where = "in the log" if result.in_log else "dropped from the log; copy kept with a retry or dead letter"
            payload = orjson.dumps(event["payload"], option=orjson.OPT_INDENT_2).decode()
            parts.append(
                f"<p>stream <b>{esc(event['stream'])}</b> · key {esc(event['key'])}"
                f" · created {esc(event['created_at'])} · {where}</p><pre>{esc(payload)}</pre>"
            )
        parts.append('<div id="live"><h3>Subscriptions</h3><table><tr><th>subscription</th><th>where the event is</th>'
                     "<th>attempts</th><th>next attempt</th><th>dead letter</th><th>last error</th></tr>")  # fmt: skip
        for sub in result.subscriptions:
            state = sub["state"]
            cls = "ok" if state == "delivered" else "bad" if state == "dead" else "warn"
            parts.append(
                f'<tr data-subscription="{esc(sub["name"])}"><td><a href="/subscriptions/{quote(sub["name"])}">'
                f'{esc(sub["name"])}</a></td><td class="{cls}">{esc(state)}</td><td>{esc(sub["attempts_so_far"])}</td>'
                f"<td>{esc(sub['next_attempt_at'])}</td><td>{esc(sub['dead_letter_id'])}</td>"
                f"<td>{esc(sub['last_error'])}</td></tr>"
            )
        parts.append("</table><h3>Attempts</h3><table><tr><th>subscription</th><th>#</th><th>at</th><th>status</th>"
                     "<th>outcome</th><th>ms</th><th>error</th><th>response</th></tr>")  # fmt: skip
        for a in result.attempts:
            ok = a["error_class"] is None
            outcome = "ok" if ok else esc(a["error_class"])
            parts.append(
                f"<tr><td>{esc(a['subscription'])}</td><td>{esc(a['attempt'])}</td><td>{esc(a['created_at'])}</td>"
                f'<td>{esc(a["status"])}</td><td class="{"ok" if ok else "bad"}">{outcome}</td>'
                f"<td>{esc(a['latency_ms'])}</td><td>{esc(a['error'])}</td>"
                f'<td class="resp">{esc(a["response"])}</td></tr>'
            )
        parts.append("</table></div>")
        return _html(_page(f"pgferry · event {raw}", "".join(parts)))

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
        raise web.HTTPSeeOther(back.split("?")[0] + "?" + urlencode({"flash": self._remember(message)}))

    async def _do(self, name: str, action: str, form: Any) -> str:
        async with self.pool.acquire() as conn:
            if not await conn.fetchval(sql.query("subscription_exists"), name):
                raise PgferryError(f"subscription {name} does not exist")
            if action == "pause":
                await conn.execute(sql.query("pause_subscription"), name)
                return f"{name} paused"
            if action == "resume":
                await conn.execute(sql.query("resume_subscription"), name)
                return f"{name} resumed"
            if action == "replay-dead":
                n = await conn.fetchval(sql.query("dlq_replay"), name, None)
                return f"{n} dead letter(s) of {name} queued for delivery"
        if action == "replay":
            return self._start_replay(name, str(form.get("since") or "").strip(), str(form.get("from_event") or ""))
        raise web.HTTPNotFound(text=f"unknown action {action}")

    def _start_replay(self, name: str, since_text: str, from_text: str) -> str:
        from_event = int(from_text) if from_text.strip().isdigit() else None
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

    def _flash(self, request: web.Request) -> str:
        msg = self.flashes.get(request.query.get("flash", ""))
        return f'<div class="flash" role="status">{esc(msg)}</div>' if msg else ""

    def _remember(self, message: str) -> str:
        """Keep a message for the page redirected to, under a random key: a crafted link cannot make
        the dashboard show text of someone else's choosing."""
        key = secrets.token_urlsafe(9)
        self.flashes[key] = message
        while len(self.flashes) > 100:
            self.flashes.popitem(last=False)
        return key

    def _actions(self, name: str, row: dict[str, Any], back: str | None = None) -> str:
        back = back or f"/subscriptions/{quote(name)}"
        buttons = []
        if row["state"] == "active":
            buttons.append(self._button(name, "pause", "Pause", back))
        else:
            buttons.append(self._button(name, "resume", "Resume", back))
        if row["dead"]:
            buttons.append(self._button(name, "replay-dead", f"Replay {row['dead']} dead letter(s)", back))
        progress = self.replays.get(name)
        if progress:
            buttons.append(f"<small>{esc(progress)}</small>")
        return "".join(buttons)

    def _button(self, name: str, action: str, label: str, back: str) -> str:
        return (
            f'<form class="inline" method="post" action="/subscriptions/{quote(name)}/{action}">'
            f'<input type="hidden" name="csrf" value="{self.csrf}">'
            f'<input type="hidden" name="back" value="{esc(back)}">'
            f'<button type="submit" data-action="{action}">{esc(label)}</button></form>'
        )

    def _subscriptions_table(self, rows: list[dict[str, Any]], charts: bool = True) -> str:
        head = ("<table><tr><th>subscription</th><th>state</th><th>endpoint</th><th>lag (events)</th><th>lag (s)</th>"
                "<th>delivered</th><th>in flight</th><th>parked</th><th>dead</th><th>errors (5m)</th><th>relay</th>"
                "<th></th></tr>")  # fmt: skip
        out = [head]
        for row in rows:
            name = row["name"]
            series = list(self.samples.get(name, ()))
            lag_chart = sparkline([s.lag_events for s in series], label="lag") if charts else ""
            rate_chart = sparkline([s.rate for s in series], label="rate") if charts else ""
            health = row["health"]
            cls = "ok" if health == "ok" else "bad" if health.startswith("failing") or health == "disabled" else "warn"
            out.append(
                f'<tr data-subscription="{esc(name)}"><td><a href="/subscriptions/{quote(name)}">{esc(name)}</a></td>'
                f'<td>{_state(row["state"])}</td><td class="{cls} health">{esc(health)}</td>'
                f"<td>{esc(row['lag_events'])} {lag_chart}</td><td>{esc(row['lag_seconds'])}</td>"
                f"<td>{esc(row['rate'])} {rate_chart}</td><td>{esc(row['in_flight'])}</td>"
                f'<td class="{"warn" if row["parked"] else ""}">{esc(row["parked"])}</td>'
                f'<td class="{"bad" if row["dead"] else ""} dead">{esc(row["dead"])}</td>'
                f"<td>{esc(row['error_rate'])}</td><td>{esc(row['owner'])}</td>"
                f"<td>{self._actions(name, row, back='/' if charts else None)}</td></tr>"
            )
        out.append("</table>")
        return "".join(out) if rows else "<p>No subscriptions yet.</p>"


def _state(state: str) -> str:
    cls = {"active": "ok", "paused": "warn", "disabled": "bad"}.get(state, "")
    return f'<span class="{cls}">{esc(state)}</span>'


def _search_form() -> str:
    return ('<form method="get" action="/events"><label>Trace event <input name="id" size="12" '
            'placeholder="event id"></label> <button>Trace</button></form>')  # fmt: skip


def _replay_form(name: str, csrf: str) -> str:
    return (
        f'<h3>Replay from the log</h3><form method="post" action="/subscriptions/{quote(name)}/replay">'
        f'<input type="hidden" name="csrf" value="{csrf}">'
        '<label>since <input name="since" value="1h" size="8"></label> or '
        '<label>from event id <input name="from_event" size="10"></label> '
        '<button type="submit" data-action="replay">Replay</button>'
        "<p><small>Queues the retained events this subscription already passed for delivery again, with their "
        "original webhook-id; events already parked or dead are skipped.</small></p></form>"
    )


def _failures_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No failed attempts in the retained history.</p>"
    out = ["<table><tr><th>at</th><th>subscription</th><th>event</th><th>#</th><th>status</th><th>error</th>"
           "<th>last response</th></tr>"]  # fmt: skip
    for r in rows:
        out.append(
            f'<tr class="failure"><td>{esc(r["created_at"])}</td><td>{esc(r["subscription"])}</td>'
            f'<td><a href="/events/{r["event_id"]}">{r["event_id"]}</a></td><td>{esc(r["attempt"])}</td>'
            f'<td>{esc(r["status"])}</td><td>{esc(r["error"])}</td><td class="resp">{esc(r["response"])}</td></tr>'
        )
    out.append("</table>")
    return "".join(out)


def _letters_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>None.</p>"
    out = ["<table><tr><th>id</th><th>event</th><th>attempts</th><th>died</th><th>status</th><th>last error</th>"
           "<th>last response</th></tr>"]  # fmt: skip
    for r in rows:
        out.append(
            f'<tr><td>{r["id"]}</td><td><a href="/events/{r["event_id"]}">{r["event_id"]}</a></td>'
            f"<td>{esc(r['attempts'])}</td><td>{esc(r['died_at'])}</td><td>{esc(r['last_status'])}</td>"
            f'<td>{esc(r["last_error"])}</td><td class="resp">{esc(r["last_response"])}</td></tr>'
        )
    out.append("</table>")
    return "".join(out)


def _relays_table(rows: list[dict[str, Any]]) -> str:
    out = ["<table><tr><th>relay</th><th>host</th><th>pid</th><th>started</th><th>heartbeat</th>"
           "<th>delivers</th></tr>"]  # fmt: skip
    for r in rows:
        live = "live" if r["live"] else f"silent {r['heartbeat_age_s']:.0f}s"
        out.append(
            f"<tr><td>{esc(r['id'])}</td><td>{esc(r['hostname'])}</td><td>{esc(r['pid'])}</td>"
            f'<td>{esc(r["started_at"])}</td><td class="{"ok" if r["live"] else "warn"}">{esc(live)}</td>'
            f"<td>{esc(r['owned'])}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
        f'<body><header><a href="/">pgferry</a><span>{esc(title)}</span></header><main>{body}</main>'
        f"<script>{REFRESH_JS}</script></body></html>"
    )


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"},
    )
