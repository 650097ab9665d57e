"""The dashboard's HTML (``ops/dashboard.py`` serves it): pure functions from rows to text.

Server-rendered, no front-end build: inline SVG charts and a few lines of
JavaScript that refresh the part of a page marked ``id="live"``. Everything
shown passes through ``esc``: response bodies come from receivers and may say
anything. Buttons post the dashboard's per-process CSRF token (``Controls``).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from pgferry.capture.backfill import Progress as BackfillProgress

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

#: The page's live part is fetched again every 3 s, and less often when the page takes long to
#: make (five times what the last fetch took: a 1,600-subscription page took 2.4-3.7 s, and every
#: open tab cost the relay ~27% of a core at a fixed 3 s; outside probe); not while the tab is hidden.
REFRESH_JS = """
async function refresh() {
  let wait = 3000;
  if (!document.hidden && !(document.activeElement && document.activeElement.tagName === 'INPUT')) {
    const started = performance.now();
    try {
      const r = await fetch(location.href, {credentials: 'same-origin'});
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
        const fresh = doc.getElementById('live'), here = document.getElementById('live');
        if (fresh && here) here.replaceWith(fresh);
      }
    } catch (e) {}
    wait = Math.max(wait, 5 * (performance.now() - started));
  }
  setTimeout(refresh, wait);
}
setTimeout(refresh, 3000);
"""

#: The Content-Security-Policy of every dashboard answer: its one script by hash, its inline
#: styles, fetches and forms to itself only, nothing else loaded, never framed. Receivers' text is
#: escaped; this keeps any markup that slipped through inert (no page sent a policy before, and
#: the token page was not even kept out of frames; outside probe).
CSP = (
    "default-src 'none'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(REFRESH_JS.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One subscription's numbers at one moment, as the charts draw them."""

    at: float
    lag_events: float
    lag_seconds: float
    rate: float


@dataclass(frozen=True, slots=True)
class Controls:
    """What buttons need: the form token, and the progress of replays started from the dashboard."""

    csrf: str
    replays: Mapping[str, str]


#: Subscriptions on one page of the overview: with 1,600 on one page it was 4.4 MB of HTML, fetched
#: again at every refresh (outside probe). Those that need attention can be listed alone.
PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Listing:
    """Which subscriptions the overview shows: names containing ``search``, only those that need
    attention, and which page of ``PAGE_SIZE``."""

    search: str = ""
    attention: bool = False
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Listing:
        number = query.get("page", "1")
        return cls(
            search=query.get("q", "").strip(),
            attention=query.get("attention") == "1",
            page=max(1, int(number)) if number.isdigit() else 1,
        )

    def href(self, page: int | None = None) -> str:
        """The overview's address for this listing (on ``page`` if given)."""
        params = {"q": self.search, "attention": "1" if self.attention else "", "page": str(page or self.page)}
        if params["page"] == "1":
            del params["page"]
        query = urlencode({k: v for k, v in params.items() if v})
        return "/" + (f"?{query}" if query else "")

    def select(self, rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """This page's rows and how many rows match in all."""
        needle = self.search.casefold()
        matching = [r for r in rows if needle in r["name"].casefold() and (not self.attention or needs_attention(r))]
        start = (self.page - 1) * PAGE_SIZE
        return matching[start : start + PAGE_SIZE], len(matching)


def needs_attention(row: Mapping[str, Any]) -> bool:
    """Not active, its endpoint failing or down, or holding parked events, dead letters or a gap
    (an active subscription with nothing to deliver yet is ``idle``, not a problem)."""
    failing = str(row["health"]).startswith(("failing", "down"))
    return bool(row["state"] != "active" or failing or row["parked"] or row["dead"] or row.get("gap_events"))


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


# -- pages ----------------------------------------------------------------------


def page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
        f'<body><header><a href="/">pgferry</a><span>{esc(title)}</span></header><main>{body}</main>'
        f"<script>{REFRESH_JS}</script></body></html>"
    )


def token_page() -> str:
    """Asked for when a token is required and none (or a wrong one) came with the request."""
    return page("token required", '<form method="get"><label>Dashboard token '
                '<input name="token" type="password" autofocus></label> <button>Open</button></form>')  # fmt: skip


def unavailable_page(reason: str) -> str:
    """Answered (503) while the database cannot be reached, which every page reads. An open page
    keeps what it showed (its refresh skips an answer that is not OK)."""
    body = f'<p class="bad">The database cannot be reached: {esc(reason)}</p><p>Reload once it is back.</p>'
    return page("database unreachable", body)


def overview_page(
    flash: str | None,
    rows: list[dict[str, Any]],
    failures: list[dict[str, Any]],
    relays: list[dict[str, Any]],
    samples: Mapping[str, Sequence[Sample]],
    controls: Controls,
    backfills: Sequence[BackfillProgress] = (),
    holding_back: Sequence[dict[str, Any]] = (),
    wal: dict[str, Any] | None = None,
    listing: Listing = Listing(),
) -> str:
    shown, matching = listing.select(rows)
    body = [_flash(flash), _search_form(), _listing_form(listing), '<div id="live">', "<h2>Subscriptions</h2>"]
    body.append(_listing_summary(rows, listing, len(shown), matching))
    body.append(_subscriptions_table(shown, samples, controls, back=listing.href()))
    body.append(_pager(listing, matching))
    if holding_back:
        body.append("<h2>Retention: consumers holding the log back</h2>")
        body.append(_retention_table(holding_back))
    if wal is not None:
        body.append("<h2>Capture from the WAL</h2>")
        body.append(_wal_table(wal))
    if backfills:
        body.append("<h2>Backfills</h2>")
        body.append(_backfills_table(backfills))
    body.append("<h2>Recent failures</h2>")
    body.append(_failures_table(failures))
    body.append("<h2>Relays</h2>")
    body.append(_relays_table(relays))
    body.append("</div>")
    return page("pgferry", "".join(body))


def subscription_page(
    flash: str | None,
    rows: list[dict[str, Any]],
    letters: list[dict[str, Any]],
    failures: list[dict[str, Any]],
    series: Sequence[Sample],
    controls: Controls,
) -> str:
    row = rows[0]
    name = row["name"]
    parts = [
        _flash(flash),
        f"<h2>{esc(name)}</h2>",
        f"<p>{esc(row['url'])} · streams {esc(row['streams'])} · state {_state(row['state'])}"
        f"{' (' + esc(row['state_reason']) + ')' if row['state_reason'] else ''} · relay {esc(row['owner'])}</p>",
        f"<p>{_actions(controls, name, row)}</p>",
        '<div id="live">',
        '<table class="charts"><tr><th>lag (events)</th><th>lag (s)</th><th>delivered per second</th></tr><tr>',
        f"<td>{sparkline([s.lag_events for s in series], 320, 60, 'lag in events')}</td>",
        f"<td>{sparkline([s.lag_seconds for s in series], 320, 60, 'lag in seconds')}</td>",
        f"<td>{sparkline([s.rate for s in series], 320, 60, 'delivery rate')}</td></tr></table>",
        _subscriptions_table(rows, {name: series}, controls, charts=False),
        f"<h3>Dead letters ({row['dead']})</h3>",
        _letters_table(letters),
        "<h3>Recent failures</h3>",
        _failures_table(failures),
        "</div>",
        _replay_form(name, controls.csrf),
    ]
    return page(f"pgferry · {name}", "".join(parts))


def event_missing_page(raw: str, error: str) -> str:
    return page(f"event {raw}", _search_form() + f"<p>{esc(error)}</p>")


def event_page(
    raw: str, event: dict[str, Any] | None, in_log: bool, subscriptions: list[dict[str, Any]], attempts: list[Any]
) -> str:
    parts = [_search_form(), f"<h2>Event {esc(raw)}</h2>"]
    if event is not None:
        where = "in the log" if in_log else "dropped from the log; copy kept with a retry or dead letter"
        payload = orjson.dumps(event["payload"], option=orjson.OPT_INDENT_2).decode()
        parts.append(
            f"<p>stream <b>{esc(event['stream'])}</b> · key {esc(event['key'])}"
            f" · created {esc(event['created_at'])} · {where}</p><pre>{esc(payload)}</pre>"
        )
    parts.append('<div id="live"><h3>Subscriptions</h3><table><tr><th>subscription</th><th>where the event is</th>'
                 "<th>attempts</th><th>next attempt</th><th>dead letter</th><th>last error</th></tr>")  # fmt: skip
    for sub in subscriptions:
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
    for a in attempts:
        ok = a["error_class"] is None
        outcome = "ok" if ok else esc(a["error_class"])
        parts.append(
            f"<tr><td>{esc(a['subscription'])}</td><td>{esc(a['attempt'])}</td><td>{esc(a['created_at'])}</td>"
            f'<td>{esc(a["status"])}</td><td class="{"ok" if ok else "bad"}">{outcome}</td>'
            f"<td>{esc(a['latency_ms'])}</td><td>{esc(a['error'])}</td>"
            f'<td class="resp">{esc(a["response"])}</td></tr>'
        )
    parts.append("</table></div>")
    return page(f"pgferry · event {raw}", "".join(parts))


# -- pieces ---------------------------------------------------------------------


def _flash(message: str | None) -> str:
    return f'<div class="flash" role="status">{esc(message)}</div>' if message else ""


def _actions(controls: Controls, name: str, row: dict[str, Any], back: str | None = None) -> str:
    back = back or f"/subscriptions/{quote(name)}"
    buttons = []
    if row["state"] == "active":
        buttons.append(_button(controls.csrf, name, "pause", "Pause", back))
    elif row["state"] == "stalled":  # retention skipped events for it: say where it reads on
        buttons.append(_button(controls.csrf, name, "resume-retained", "Resume from the oldest retained", back))
        buttons.append(_button(controls.csrf, name, "resume-now", "Resume from now", back))
    else:
        buttons.append(_button(controls.csrf, name, "resume", "Resume", back))
    if row["dead"]:
        buttons.append(_button(controls.csrf, name, "replay-dead", f"Replay {row['dead']} dead letter(s)", back))
    progress = controls.replays.get(name)
    if progress:
        buttons.append(f"<small>{esc(progress)}</small>")
    return "".join(buttons)


def _button(csrf: str, name: str, action: str, label: str, back: str) -> str:
    return (
        f'<form class="inline" method="post" action="/subscriptions/{quote(name)}/{action}">'
        f'<input type="hidden" name="csrf" value="{csrf}">'
        f'<input type="hidden" name="back" value="{esc(back)}">'
        f'<button type="submit" data-action="{action}">{esc(label)}</button></form>'
    )


def _subscriptions_table(
    rows: list[dict[str, Any]],
    samples: Mapping[str, Sequence[Sample]],
    controls: Controls,
    charts: bool = True,
    back: str | None = None,
) -> str:
    head = ("<table><tr><th>subscription</th><th>state</th><th>endpoint</th><th>lag (events)</th><th>lag (s)</th>"
            "<th>delivered</th><th>in flight</th><th>parked</th><th>dead</th><th>errors (5m)</th><th>relay</th>"
            "<th></th></tr>")  # fmt: skip
    out = [head]
    for row in rows:
        name = row["name"]
        series = list(samples.get(name, ()))
        lag_chart = sparkline([s.lag_events for s in series], label="lag") if charts else ""
        rate_chart = sparkline([s.rate for s in series], label="rate") if charts else ""
        health = row["health"]
        cls = "ok" if health == "ok" else "bad" if health.startswith("failing") or health == "disabled" else "warn"
        out.append(
            f'<tr data-subscription="{esc(name)}"><td><a href="/subscriptions/{quote(name)}">{esc(name)}</a>'
            f"{_filter_note(row)}</td>"
            f'<td>{_state(row["state"])}{_retention_note(row)}</td><td class="{cls} health">{esc(health)}</td>'
            f"<td>{esc(row['lag_events'])} {lag_chart}</td><td>{esc(row['lag_seconds'])}</td>"
            f"<td>{esc(row['rate'])} {rate_chart}</td><td>{esc(row['in_flight'])}</td>"
            f'<td class="{"warn" if row["parked"] else ""}">{esc(row["parked"])}</td>'
            f'<td class="{"bad" if row["dead"] else ""} dead">{esc(row["dead"])}</td>'
            f"<td>{esc(row['error_rate'])}</td><td>{esc(row['owner'])}</td>"
            f"<td>{_actions(controls, name, row, back=back)}</td></tr>"
        )
    out.append("</table>")
    return "".join(out) if rows else "<p>No subscriptions here.</p>"


def _listing_form(listing: Listing) -> str:
    checked = " checked" if listing.attention else ""
    return (
        '<form method="get" action="/" class="listing"><label>Subscriptions named '
        f'<input name="q" size="20" value="{esc(listing.search)}" placeholder="part of a name"></label> '
        f'<label><input type="checkbox" name="attention" value="1"{checked}> only those that need attention</label> '
        "<button>Show</button></form>"
    )


def _listing_summary(rows: Sequence[dict[str, Any]], listing: Listing, shown: int, matching: int) -> str:
    attention = sum(1 for r in rows if needs_attention(r))
    first = (listing.page - 1) * PAGE_SIZE + 1
    where = f"{first}-{first + shown - 1} of {matching} shown" if shown else "none shown"
    return f'<p class="listing-summary">{len(rows)} subscription(s), {attention} need attention; {where}.</p>'


def _pager(listing: Listing, matching: int) -> str:
    pages = max(1, -(-matching // PAGE_SIZE))
    if pages == 1 and listing.page == 1:
        return ""
    links = []
    if listing.page > 1:
        links.append(f'<a rel="prev" href="{esc(listing.href(min(listing.page - 1, pages)))}">previous</a>')
    links.append(f"page {listing.page} of {pages}")
    if listing.page < pages:
        links.append(f'<a rel="next" href="{esc(listing.href(listing.page + 1))}">next</a>')
    return f'<p class="pager">{" · ".join(links)}</p>'


def _retention_note(row: dict[str, Any]) -> str:
    """Under a subscription's state: how it stands against the retention limit, unless fine."""
    retention = row.get("retention", "-")
    if retention in ("ok", "-"):
        return ""
    return f'<br><small class="bad retention">retention {esc(retention)}</small>'


def _retention_table(rows: Sequence[dict[str, Any]]) -> str:
    """Consumers holding the log back (50%/80% of the retention limit), stalled, or with gaps."""
    out = ["<table><tr><th>consumer</th><th>retention</th><th>cursor age</th><th>holds</th><th>of limit</th>"
           "<th>events lost</th><th>why</th></tr>"]  # fmt: skip
    for r in rows:
        cls = "warn" if r["level"] == "50%" else "bad"
        out.append(
            f'<tr data-consumer="{esc(r["consumer"])}"><td>{esc(r["consumer"])}</td>'
            f'<td class="{cls}">{esc(r["level"])}</td><td>{esc(r["cursor_age"])}</td><td>{esc(r["held"])}</td>'
            f"<td>{esc(r['limit_pct'])}</td><td>{esc(r['lost'])}</td><td>{esc(r['why'])}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _wal_table(wal: dict[str, Any]) -> str:
    """WAL capture's slot: how far behind the WAL the log is, or that it stopped and why."""
    problems = wal.get("identity_problems") or ()
    ok = f'<span class="ok">{esc(wal["wal_status"])}</span>'
    state = ('<span class="bad">stopped</span>' if wal["stopped"]
             else '<span class="bad">failing</span>' if wal["error"] else ok)  # fmt: skip
    return (
        "<table><tr><th>slot</th><th>tables</th><th>state</th><th>behind (WAL bytes)</th><th>behind (s)</th>"
        f'<th>note</th></tr><tr data-slot="{esc(wal["slot_name"])}"><td>{esc(wal["slot_name"])}</td>'
        f"<td>{esc(wal['tables'])}</td><td>{state}</td><td>{wal['lag_bytes']:,}</td>"
        f"<td>{wal['lag_seconds']:.1f}</td><td>{esc(wal['error'] or wal['note'] or '')}</td></tr></table>"
        + "".join(f'<p class="bad wal-identity">WAL capture of {esc(p)}</p>' for p in problems)
    )


def _filter_note(row: dict[str, Any]) -> str:
    """Under a subscription's name: its filter as written, when it has one (only matching events are sent)."""
    return f'<br><small class="filter">filter <code>{esc(row["filter"])}</code></small>' if row.get("filter") else ""


def _state(state: str) -> str:
    cls = {"active": "ok", "paused": "warn", "disabled": "bad", "stalled": "bad"}.get(state, "")
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


def _backfills_table(items: Sequence[BackfillProgress]) -> str:
    """Backfills running, paused or finished in the last day, with a progress bar against the estimate."""
    out = ["<table><tr><th>id</th><th>table</th><th>for</th><th>state</th><th>progress</th><th>rows done</th>"
           "<th>rate</th><th>ETA</th></tr>"]  # fmt: skip
    for b in items:
        total = b.total
        bar = (f'<progress value="{b.rows_done}" max="{total}"></progress>' if total
               else "<progress></progress>" if b.state == "running" else "")  # fmt: skip
        state = (f"orphaned? no chunk for {b.idle_seconds or 0:,.0f} s: pgferry backfill --resume {b.id}"
                 if b.orphaned else b.state + (f": {b.reason}" if b.reason else ""))  # fmt: skip
        css = "warn" if b.state == "failed" or b.orphaned else "ok" if b.state == "done" else ""
        out.append(
            f"<tr><td>{esc(b.id)}</td><td>{esc(b.table)}</td><td>{esc(b.target or 'everyone')}</td>"
            f'<td class="{css}">{esc(state)}</td><td>{bar}</td>'
            f"<td>{esc(f'{b.rows_done:,}')} / {esc(f'~{total:,}' if total is not None else '?')}</td>"
            f"<td>{esc(f'{b.rate:,.0f}/s' if b.rate is not None else '')}</td>"
            f"<td>{esc(str(b.eta).split('.')[0] if b.eta is not None else '')}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)
