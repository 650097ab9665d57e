"""Read-side operator queries shared by the CLI and the dashboard.

Everything here reads PostgreSQL only (rates come from the owning relay's
heartbeat), so the CLI and the dashboard show the same numbers, and neither
needs the relay to be reachable over the network.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson

from pgferry import sql
from pgferry.db import RawJSON
from pgferry.errors import PgferryError

#: how much of a response body trace shows
RESPONSE_SNIPPET = 500


_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)\s*(ago)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (naive means UTC) or a duration back from now: '15m', '2 hours', '1d ago'."""
    now = now or datetime.now(UTC)
    match = _AGO.match(text)
    if match:
        try:  # '99999999d' reaches before year 1 (an OverflowError: a traceback, a dashboard 500; outside probe)
            return now - timedelta(seconds=float(match[1]) * _UNITS[match[2][0]])
        except OverflowError:
            raise ValueError(f"{text!r} reaches back before year 1; give a shorter duration or an ISO time") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO time (2026-11-30T10:00:00Z) nor a duration (15m, 2h)") from None
    try:  # in UTC, as the database takes it: 0001-01-01T00:00:00+01:00 is before year 1 (outside probe)
        return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError(f"{text!r} is outside years 1-9999 in UTC; give a time within them") from None


def _rows(records: list[asyncpg.Record]) -> list[dict[str, Any]]:
    return [dict(r) for r in records]


def health(sub: dict[str, Any], now: datetime | None = None) -> str:
    """One word (and why) for an endpoint, from its newest attempts.

    ``ok``: the newest attempt succeeded; ``failing``: it failed (with the
    error and for how long there has been no success); ``idle``: no attempt
    in the retained history; ``down``: the delivering relay holds the
    endpoint as down (its events held while a probe a second goes out);
    ``disabled``/``paused`` from the subscription.
    """
    now = now or datetime.now(UTC)
    if sub.get("state") == "disabled":
        return "disabled"
    last = sub.get("last_attempt_at")
    if last is None:
        return "paused" if sub.get("state") == "paused" else "idle"
    down_since = sub.get("endpoint_down_since")
    if down_since is not None:  # the relay holds its events and probes it
        why = f" ({sub['last_error']})" if sub.get("last_error") else ""
        return f"down for {_ago(now - down_since)}{why}: events held; a due one probes it, at most once a second"
    if sub.get("last_error_class") is None:
        return "ok"
    since = sub.get("last_success_at")
    how_long = f", no success for {_ago(now - since)}" if since else ", never succeeded"
    return f"failing: {sub.get('last_error') or sub.get('last_error_class')}{how_long}"


def _ago(delta: Any) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def unwritten(streams: list[str], unknown: list[str]) -> str:
    """What status says of a subscription whose streams ``unknown`` nothing has written yet."""
    if len(unknown) == 1:
        return "no events ever written to " + ("this stream" if len(streams) == 1 else f"stream {unknown[0]}")
    return f"no events ever written to streams {', '.join(unknown)}"


def unwritten_warning(stream: str, then: str = "the subscription delivers once events arrive") -> str:
    """ferry.subscribe's NOTICE about a stream nothing has written yet, in one line (``then``: what
    happens when events do arrive)."""
    return (
        f"no events have been written to stream {orjson.dumps(stream).decode()} yet; check the spelling "
        f"(streams are written by captured tables, named schema.table, and by ferry.publish); {then}"
    )


async def subscription_status(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """ferry.subscription_status() plus rates, error rate and endpoint health per subscription.

    A subscription that never had anything to deliver (no attempt, parked event
    or dead letter) also gets ``unknown_streams``, its streams nothing has
    written yet, and says so in its health; only those are looked up, so
    status stays as cheap as before for every subscription that delivers.
    """
    rows = _rows(await conn.fetch(sql.query("subscription_status")))
    health_rows = {r["name"]: dict(r) for r in await conn.fetch(sql.query("endpoint_health"))}
    down = {r["name"]: r["down_since"] for r in await conn.fetch(sql.query("endpoints_down"))}
    retention = _worst_per_subscription(await retention_status(conn))
    now = datetime.now(UTC)
    for row in rows:
        extra = health_rows.get(row["name"], {})
        for key in ("last_attempt_at", "last_status", "last_error_class", "last_error", "last_success_at"):
            row[key] = extra.get(key)
        row["endpoint_down_since"] = down.get(row["name"])
        attempts = row["attempts_5m"] or 0
        row["error_rate"] = f"{100 * (row['failed_5m'] or 0) / attempts:.1f}%" if attempts else "-"
        row["rate"] = f"{(row['delivered_1m'] or 0) / 60:.1f}/s"
        row["rate_per_s"] = (row["delivered_1m"] or 0) / 60
        row["health"] = health(row, now)
        row["unknown_streams"] = []
        held, gap_events = retention.get(row["name"], ({}, 0))
        # The worst partition's standing, with every partition's lost events (gap_events sums them).
        row["retention"] = retention_summary({**held, "gap_events": gap_events}) if held else "-"
        row["gap_events"] = gap_events
    never = [r["name"] for r in rows if r["last_attempt_at"] is None and not r["parked"] and not r["dead"]]
    if never:
        found = await conn.fetch(sql.query("subscriptions_unknown_streams"), never)
        unknown = {r["name"]: list(r["unknown"]) for r in found if r["unknown"]}
        for row in rows:
            if row["name"] in unknown and row["state"] != "disabled":
                row["unknown_streams"] = unknown[row["name"]]
                row["health"] = f"{row['health']}: {unwritten(row['streams'], row['unknown_streams'])}"
    return rows


async def retention_status(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """ferry.retention_status(): per consumer, how close it is to the retention limit, stalled or not,
    and the events its gaps lost."""
    return _rows(await conn.fetch(sql.query("retention_status")))


def _worst_per_subscription(rows: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], int]]:
    """Per subscription, the retention row of its partition closest to the limit (a stalled one
    first), with the most WAL losses any of its partitions has (each records the same loss), and
    the events the gaps of all its partitions lost."""
    worst: dict[str, tuple[dict[str, Any], int]] = {}
    for row in rows:
        name = row["subscription"]
        if name is None:
            continue
        held, lost = worst.get(name, (None, 0))
        wal_gaps = max(row.get("wal_gaps") or 0, (held or {}).get("wal_gaps") or 0)
        if held is None or _closeness(row) > _closeness(held):
            held = row
        worst[name] = ({**held, "wal_gaps": wal_gaps}, lost + (row.get("gap_events") or 0))
    return worst


def _closeness(row: dict[str, Any]) -> tuple[bool, float]:
    return row["stalled_at"] is not None, max(row["time_pct"] or 0.0, row["size_pct"] or 0.0)


def retention_summary(row: dict[str, Any]) -> str:
    """A consumer's standing against the retention limit in a few words, for status and the dashboard:
    ``ok``; ``50%: cursor 3d 12h old, holds 1.2 GB``; ``stalled: ...``; with ``, N event(s) lost`` when
    it has gaps, ``, changes lost from the WAL (N gap(s))`` when WAL capture's slot was lost under it or a change
    of its streams was skipped (ferry.skip_wal_change)."""
    lost = f", {row['gap_events']} event(s) lost (gaps)" if row.get("gap_events") else ""
    if row.get("wal_gaps"):
        lost += f", changes lost from the WAL ({row['wal_gaps']} gap(s))"
    if row["level"] == "stalled":
        return f"stalled since {row['stalled_at']:%Y-%m-%d %H:%M:%S%z}{lost}"
    if row["level"] == "ok":
        return "ok" + lost
    return (
        f"{row['level']} of the limit: cursor {_age(row['lag_seconds'])} old, holds {_bytes(row['held_bytes'])}{lost}"
    )


def holding_back(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The consumers status must name: at 50% or more of the retention limit, stalled, or with gaps;
    each with ``summary``, ``lost`` (the events its gaps lost, and WAL losses) and ``why``."""
    out = [dict(r) for r in rows if r["level"] != "ok" or r["gaps"]]
    for row in out:
        row["summary"] = retention_summary(row)
        row["lost"] = str(row["gap_events"] or 0)
        row["why"] = row["stalled_reason"]
        if row.get("wal_gaps"):
            row["lost"] += f" + changes from the WAL ({row['wal_gaps']} gap(s))"
            row["why"] = "; ".join(filter(None, [row["why"], WAL_LOSS]))
        row["cursor_age"] = _age(row["lag_seconds"])
        row["held"] = _bytes(row["held_bytes"])
        row["limit_pct"] = f"{max(row['time_pct'], row['size_pct']):.0f}%"
    return out


#: What a consumer's WAL gap means, for status and the dashboard: WAL capture's slot lost (ferry._record_wal_loss,
#: migration 0025) or a change skipped (ferry._record_wal_skip, migration 0037)
WAL_LOSS = ("changes of tables captured with method 'wal' never reached the log (WAL capture's slot was lost, or a "
            "change was skipped with ferry.skip_wal_change): `pgferry retention show` lists the gaps and what to "
            "`pgferry backfill`")  # fmt: skip


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


async def gaps(conn: asyncpg.Connection, consumer: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    return _rows(await conn.fetch(sql.query("gaps_list"), consumer, limit))


async def relays(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return _rows(await conn.fetch(sql.query("relays_status")))


async def captures(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """The captured tables, each with ``captured``: which rows and columns reach the log, in words,
    so an operator sees at a glance why a change did not show up (or a column is missing)."""
    rows = _rows(await conn.fetch(sql.query("captures_current")))
    for row in rows:
        row["captured"] = capture_summary(row)
        if row["captured_as"] != row["table_name"]:
            row["captured"] += (f"; renamed since it was captured as {row['captured_as']}, the name its events still "
                                "carry: capture it again to change that")  # fmt: skip
    return rows


async def replica_role_settings(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Settings that put this database's writers in session_replication_role = replica, where
    trigger capture sees nothing (queries.sql, replica_role_settings): who, where, and the undo."""
    return _rows(await conn.fetch(sql.query("replica_role_settings")))


async def wal_status(conn: asyncpg.Connection) -> dict[str, Any] | None:
    """WAL capture's slot and lag (None when no table was ever captured from the WAL)."""
    row = await conn.fetchrow(sql.query("wal_status"))
    return None if row is None else dict(row)


def capture_summary(capture: dict[str, Any]) -> str:
    """What a capture keeps, in words: "every row, whole" without filters, else e.g. "rows where
    (status = 'paid'::text) (UPDATE: old or new row); columns id, status"."""
    parts = []
    if capture.get("condition"):
        parts.append(f"rows where {capture['condition']} (UPDATE: old or new row)")
    if capture.get("changed_columns"):
        parts.append(f"UPDATE only when {', '.join(capture['changed_columns'])} changed")
    if capture.get("columns"):
        parts.append(f"columns {', '.join(capture['columns'])}")
    if capture.get("exclude_columns"):
        parts.append(f"all columns but {', '.join(capture['exclude_columns'])}")
    return "; ".join(parts) or "every row, whole"


@dataclass
class Trace:
    event: dict[str, Any] | None
    in_log: bool
    subscriptions: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    #: the recorded gaps whose event id range holds it: consumers that never got it (migration 0014)
    gaps: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "in_log": self.in_log,
            "subscriptions": self.subscriptions,
            "attempts": self.attempts,
            "gaps": self.gaps,
        }


async def trace(conn: asyncpg.Connection, event_id: int, snippet: int = RESPONSE_SNIPPET) -> Trace:
    """The event, each subscription it matched with where it is now, and every attempt."""
    row = await conn.fetchrow(sql.query("lookup_event"), event_id)
    in_log = row is not None
    if row is None:
        row = await conn.fetchrow(sql.query("parked_or_dead_copy"), event_id)
    attempts = _rows(await conn.fetch(sql.query("trace_attempts"), event_id, snippet, None))
    in_gaps = _rows(await conn.fetch(sql.query("gaps_of_event"), event_id))
    for gap in in_gaps:
        gap["state"] = gap_state(gap)
    if row is None:
        if in_gaps:
            subs = [{"name": g["subscription"] or g["consumer"], "state": g["state"], "attempts_so_far": None,
                     "next_attempt_at": None, "dead_letter_id": None, "last_error": None}
                    for g in in_gaps]  # fmt: skip
            return Trace(None, False, subs, attempts, in_gaps)
        if not attempts:
            raise PgferryError(
                f"event {event_id} is not in the retained log, parked retries, dead letters or attempt history "
                "(it may not exist, may not have committed, or retention may have dropped it)"
            )
        return Trace(None, False, [], attempts)
    event = dict(row)
    args = (
        event["stream"],
        event["txid"],
        event["key"],
        _jsonb(event["payload"]),
        _jsonb(event["headers"]),
        event.get("target"),
    )
    subs = _rows(await conn.fetch(sql.query("trace_subscriptions"), event_id, *args))
    lost = {g["subscription"]: g for g in in_gaps if g["subscription"]}
    for sub in subs:  # a copy kept with a retry is not lost; a "passed" one in a gap was
        if sub["name"] in lost and sub["state"].startswith("passed (no attempt"):
            sub["state"] = lost[sub["name"]]["state"]
    return Trace(event, in_log, subs, attempts, in_gaps)


def gap_state(gap: dict[str, Any]) -> str:
    """Where an event in a consumer's gap is: never sent, and why (the event itself is gone, so its
    stream is not known: the gap covers ids first to last of the consumer's streams)."""
    why = "dropped by retention while it was stalled" if gap["cause"] == "retention" else "skipped by a resume from now"
    return (
        f"skipped: in gap {gap['id']} ({gap['events']} event(s) of its streams, ids {gap['first_event_id']} "
        f"to {gap['last_event_id']}, {why})"
    )


def _jsonb(value: Any) -> Any:
    """A jsonb value read back as a parameter: JSON too deep for orjson came as RawJSON text, sent back as is."""
    return value.encode() if isinstance(value, RawJSON) else value


def no_such_subscription(name: str) -> str:
    return f"pgferry: subscription {name!r} does not exist; see `pgferry subscription list`"


async def require_subscription(conn: asyncpg.Connection, name: str) -> None:
    """Raise, as pause does, when there is no subscription ``name``: `subscription remove`, `dlq
    replay|discard` and `dlq list --subscription` of a typo said "removed", "0 queued" or listed
    nothing with exit 0, and a script could not tell (outside review)."""
    if not await conn.fetchval(sql.query("subscription_exists"), name):
        raise PgferryError(no_such_subscription(name))


async def dead_letter(conn: asyncpg.Connection, letter_id: int, snippet: int = RESPONSE_SNIPPET) -> dict[str, Any]:
    """A dead letter in full, with the attempt history of its event for its subscription."""
    row = await conn.fetchrow(sql.query("dlq_show"), letter_id)
    if row is None:
        raise PgferryError(f"dead letter {letter_id} does not exist (replayed or discarded?); see `pgferry dlq list`")
    letter = dict(row)
    letter["attempt_history"] = _rows(
        await conn.fetch(sql.query("trace_attempts"), letter["event_id"], snippet, letter["subscription"])
    )
    return letter


async def recent_failures(
    conn: asyncpg.Connection, subscription: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    return _rows(await conn.fetch(sql.query("recent_failures"), subscription, limit))


@dataclass
class ReplayProgress:
    queued: int
    skipped: int
    done: bool


async def replay_count(
    conn: asyncpg.Connection, subscription: str, since: datetime | None, from_event: int | None
) -> int:
    return int(await _admin(conn.fetchval(sql.query("replay_count"), subscription, since, from_event)))


async def replay(
    conn: asyncpg.Connection,
    subscription: str,
    *,
    since: datetime | None = None,
    from_event: int | None = None,
    chunk: int = 1000,
) -> AsyncIterator[ReplayProgress]:
    """Queue the subscription's already-passed, retained events again, one committed chunk at a time.

    Each chunk (a range of ticks holding about ``chunk`` events) is its own
    transaction, so a long replay holds no long locks and shows progress, and
    an interrupted one keeps what it queued (running it again skips that).
    The walk ends at the subscription's cursor as it was at the start: what
    the live stream delivers meanwhile is not replayed.
    """
    after: int | None = None
    until: int | None = None
    while True:
        row = await _admin(
            conn.fetchrow(sql.query("replay_chunk"), subscription, since, from_event, after, until, chunk)
        )
        if row is None or row["last_tick"] is None:
            yield ReplayProgress(0, 0, True)
            return
        after, until = row["last_tick"], row["end_tick"]
        yield ReplayProgress(int(row["queued"]), int(row["skipped"]), False)


async def _admin(awaitable: Any) -> Any:
    try:
        return await awaitable
    except asyncpg.PostgresError as exc:
        if exc.sqlstate in ("22023", "22004", "42704"):
            raise PgferryError(str(exc)) from exc
        raise
