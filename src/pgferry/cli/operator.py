"""`pgferry status`, `relays`, `trace`, `tail`, `replay` and `apply`: what operators run."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import pgferry
from pgferry import db, sql
from pgferry.capture import backfill as backfills
from pgferry.cli.common import (
    BACKFILL_COLUMNS,
    INTERVAL_HINT,
    INTERVAL_REFUSALS,
    attempts_table,
    backfill_rows,
    console,
    database_url_option,
    escape,
    json_option,
    naming,
    on_conn,
    print_json,
    require_url,
    run_coroutine,
    table,
    visible,
    with_ferry,
)
from pgferry.errors import PgferryError
from pgferry.ops import apply as applying
from pgferry.ops import inspect
from pgferry.ops.tail import tail as follow
from pgferry.params import INT8, seconds
from pgferry.schema import LOCK_CLASS, PRESENCE_LOCK, check_installed


def parse_since(text: str) -> datetime:
    """--since: an ISO 8601 time (UTC if no zone) or a duration back from now ('15m', '2 hours', '1d ago')."""
    try:
        return inspect.parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


@click.command()
@database_url_option
@json_option
def status(database_url: str | None, as_json: bool) -> None:
    """Per subscription: lag, rate, in flight, parked, dead, error rate, endpoint health, owning relay;
    then every relay and what it owns, the captured tables with their filters, and backfills running,
    paused or finished in the last day.
    --json: the subscriptions (relays: `pgferry relays --json`, backfills: `pgferry backfill --list --json`)."""

    async def read(
        f: pgferry.Ferry,
    ) -> tuple[
        list[dict[str, Any]],
        list[dict[str, Any]],
        list[dict[str, Any]],
        list[backfills.Progress],
        list[dict[str, Any]],
        dict[str, Any] | None,
        list[dict[str, Any]],
    ]:
        async with f.pool.acquire() as conn:
            return (await inspect.subscription_status(conn), await inspect.relays(conn), await inspect.captures(conn),
                    await backfills.listing(conn), await inspect.retention_status(conn),
                    await inspect.wal_status(conn), await inspect.replica_role_settings(conn))  # fmt: skip

    rows, relay_rows, capture_rows, backfill_list, retention_rows, wal, replica = with_ferry(database_url, read)
    if as_json:
        print_json(rows)
        return
    columns = [("name", "subscription"), ("state", "state"), ("lag_events", "lag (events)"),
               ("lag_seconds", "lag (s)"), ("rate", "delivered"), ("in_flight", "in flight"), ("parked", "parked"),
               ("dead", "dead"), ("error_rate", "errors (5m)"), ("health", "endpoint"),
               ("owner", "relay")]  # fmt: skip
    if any(row["filter"] for row in rows):  # a column only when some subscription filters
        columns.insert(1, ("filter", "filter"))
    if any(row["retention"] not in ("ok", "-") for row in rows):
        columns.insert(-1, ("retention", "retention"))
    if any(row["partitions"] > 1 or row["draining"] for row in rows):  # only when some subscription has them
        for row in rows:
            row["partitioned"] = str(row["partitions"]) + (f" ({row['draining']} draining)" if row["draining"] else "")
        columns.insert(2, ("partitioned", "partitions"))
    if rows and not any(r["live"] for r in relay_rows):
        # Nothing ticks without a relay, and lag is measured in ticks: it would read 0 however
        # much was written meanwhile.
        click.secho("no relay is running: nothing is ticked or delivered, and the lag below counts only "
                    "events up to the last tick; start one with `pgferry run`", fg="red")  # fmt: skip
    table("delivery status", rows, columns, styles=_STATUS_STYLES)
    _retention_table(inspect.holding_back(retention_rows))
    _relays_table(relay_rows)
    if capture_rows:
        capture_columns = [("table_name", "table"), ("stream", "stream"), ("method", "by"),
                           ("operations", "operations"), ("captured", "captured")]  # fmt: skip
        table("captured tables", capture_rows, capture_columns)
        if replica and any(row["method"] == "trigger" for row in capture_rows):
            for setting in replica:
                where = f"{setting['who']} in {setting['where_set']}"
                click.secho(f"session_replication_role = replica is set for {where}: no trigger fires in those "
                            "sessions, so their writes to tables captured by trigger are not "
                            f"captured; undo it ({setting['undo']}) or capture those tables from the WAL "
                            "(method => 'wal'), which sees them", fg="red")  # fmt: skip
    if wal is not None:
        _wal_line(wal)
    if backfill_list:
        table("backfills", backfill_rows(backfill_list), BACKFILL_COLUMNS)


@click.command()
@database_url_option
@json_option
def relays(database_url: str | None, as_json: bool) -> None:
    """Relay processes: host, pid, heartbeat, live or not, and the subscriptions each delivers."""
    rows = with_ferry(database_url, lambda f: on_conn(f, inspect.relays))
    if as_json:
        print_json(rows)
        return
    _relays_table(rows)


@click.command()
@database_url_option
@click.argument("event_id", type=click.IntRange(1, 2**63 - 1))
@json_option
def trace(database_url: str | None, event_id: int, as_json: bool) -> None:
    """Follow event EVENT_ID: the event, the subscriptions it matched and where it is for each,
    every delivery attempt with status, latency and error or response."""
    result = with_ferry(database_url, lambda f: on_conn(f, lambda c: inspect.trace(c, event_id)))
    if as_json:
        print_json(result.as_dict())
        return
    event = result.event
    if event is None and result.gaps:
        console.print(f"event {event_id} is no longer retained, and falls into a recorded gap:", markup=False)
        columns = [("name", "subscription / consumer"), ("state", "where the event is")]
        table("subscriptions", result.subscriptions, columns, styles={"state": _trace_style})
    elif event is None:
        console.print(f"event {event_id} is no longer retained; its attempt history:", markup=False)
    else:
        where = (
            "in the log" if result.in_log else "dropped from the log by retention; copy kept with a retry/dead letter"
        )
        console.print(f"[bold]event {event['id']}[/] on stream [bold]{escape(visible(event['stream']))}[/], "
                      f"key {escape(visible(str(event['key'] or '-')))}, "
                      f"created {event['created_at']:%Y-%m-%d %H:%M:%S%z} ({where})")  # fmt: skip
        payload = orjson.dumps(event["payload"]).decode()
        console.print("payload:", payload if len(payload) <= 2000 else payload[:2000] + " …", markup=False)
        if event["headers"]:
            console.print("headers:", orjson.dumps(event["headers"]).decode(), markup=False)
        if result.subscriptions:
            columns = [("name", "subscription"), ("state", "where the event is"),
                       ("attempts_so_far", "attempts"), ("next_attempt_at", "next attempt"),
                       ("dead_letter_id", "dead letter"), ("last_error", "last error")]  # fmt: skip
            # a held event (the state the trace query gives it) is due but waits for its endpoint: its
            # due time, past, said nothing (outside probe)
            held = "held (endpoint down)"
            rows = [{**row, "next_attempt_at": "when a probe gets an answer"} if row["state"] == held else row
                    for row in result.subscriptions]  # fmt: skip
            table("subscriptions", rows, columns, styles={"state": _trace_style})
        else:
            console.print("no subscription matches its stream")
    if result.attempts:
        attempts_table(result.attempts)
    else:
        console.print("no delivery attempts recorded")


@click.command()
@database_url_option
@click.argument("streams", nargs=-1)
@json_option
@click.option("--count", type=click.IntRange(1), help="Exit after this many events.")
@click.option("--timeout", type=seconds(), help="Exit after this many seconds.")
def tail(database_url: str | None, streams: tuple[str, ...], as_json: bool, count: int | None,
         timeout: float | None) -> None:  # fmt: skip
    """Print events of STREAMS (all streams if none) as they commit, until interrupted.

    Uses no consumer: it holds back no retention and disturbs no reader.
    --json prints one JSON object per line."""
    url = require_url(database_url)

    async def go() -> None:
        conn = await db.connect(url)
        try:  # events reach tail with the ticks relays take: without one it printed nothing, unsaid
            await check_installed(conn)
            if not await conn.fetch(sql.query("relays_present"), LOCK_CLASS, PRESENCE_LOCK):
                click.echo("warning: no relay is running; events show here once one takes ticks (`pgferry run`)",
                           err=True)  # fmt: skip
        finally:
            await conn.close()
        seen = 0
        events = follow(url, streams or None)
        try:
            async with asyncio.timeout(timeout):
                async for event in events:
                    _print_event(event, as_json)
                    seen += 1
                    if count is not None and seen >= count:
                        return
        except TimeoutError:
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    with contextlib.suppress(KeyboardInterrupt):
        run_coroutine(go(), url=url)


@click.command()
@database_url_option
@click.argument("subscription")
@click.option("--since", help="Events created since this time: ISO 8601 (UTC if no zone) or '15m', '2h', '1d'.")
@click.option("--from-event", type=click.IntRange(0, 2**63 - 1), help="Events from this event id on.")
@click.option("--chunk", default=1000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="About this many log events read per transaction.")  # fmt: skip
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (only asked in a terminal).")
@json_option
def replay(database_url: str | None, subscription: str, since: str | None, from_event: int | None, chunk: int,
           yes: bool, as_json: bool) -> None:  # fmt: skip
    """Deliver again events SUBSCRIPTION already passed, from the retained log.

    The events are queued in the subscription's retry queue (ferry.retries) and
    sent by its retry loop alongside the live stream, with their original
    webhook-id. Events already parked or dead-lettered are skipped."""
    if (since is None) == (from_event is None):
        raise click.UsageError("give exactly one of --since or --from-event")
    since_at = parse_since(since) if since is not None else None
    url = require_url(database_url)

    async def go() -> tuple[dict[str, int], str]:
        async with pgferry.connect(url, pool_size=1) as f, f.pool.acquire() as conn:
            total = await inspect.replay_count(conn, subscription, since_at, from_event)
            if total and not yes and not as_json and sys.stdin.isatty():
                what = f"since {since_at:%Y-%m-%d %H:%M:%S%z}" if since_at else f"from event {from_event}"
                prompt = f"queue {total} retained event(s) of {subscription} {what} for delivery again?"
                if not await asyncio.to_thread(click.confirm, prompt, default=True):
                    raise click.Abort()
            queued = skipped = 0
            with Progress(
                TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                console=console, disable=as_json or total == 0, transient=False,
            ) as progress:  # fmt: skip
                task = progress.add_task("replay", total=total)
                async for step in inspect.replay(
                    conn, subscription, since=since_at, from_event=from_event, chunk=chunk
                ):
                    queued += step.queued
                    skipped += step.skipped
                    progress.advance(task, step.queued + step.skipped)
            target = await conn.fetchval(sql.query("subscription_url"), subscription)
            return {"matched": total, "queued": queued, "skipped": skipped}, str(target or "")

    counts, target = run_coroutine(go(), url=url)
    if as_json:
        print_json(counts)
        return
    click.echo(
        f"{counts['queued']} event(s) queued for delivery again, {counts['skipped']} skipped "
        "(already parked or dead letters: see `pgferry dlq replay`)"
    )
    if counts["queued"] and target.partition(":")[0].lower() in ("nats", "redis"):
        click.echo(  # the replay is recorded as delivered either way (docs/sinks.md)
            "note: the broker drops a message whose webhook-id it stored within its duplicate window "
            "(JetStream's duplicate_window; Redis: the URL's dedup_window, 120 s by default): events it "
            "received that recently are not stored again"
        )


@click.command()
@database_url_option
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default="pgferry.toml")
@click.option("--dry-run", is_flag=True, help="Only print what would change.")
@click.option("--prune", is_flag=True, help="Also remove subscriptions not in the file that apply did not create.")
@click.option("--yes", is_flag=True,
              help="Remove subscriptions whose parked retries or dead letters go with them without asking "
                   "(asked in a terminal; refused without --yes elsewhere).")  # fmt: skip
@json_option
def apply(database_url: str | None, path: Path, dry_run: bool, prune: bool, yes: bool, as_json: bool) -> None:
    """Make the webhook subscriptions match PATH (default pgferry.toml): create, update, remove.

    Prints the changes, and what removals delete with them. Only subscriptions named
    in the file or created by an earlier apply are changed or removed, unless --prune.
    A removal that deletes parked retries or dead letters needs --yes (or a yes at the
    prompt in a terminal). Secrets come from the environment variables the file names
    (secret_env, headers_env) and are never printed. Applies at once run one after
    the other."""
    url = require_url(database_url)
    try:
        desired = applying.load(path)
    except PgferryError as exc:
        raise click.ClickException(str(exc)) from exc

    async def go(allow: bool | dict[str, tuple[int, int]]) -> tuple[list[applying.Change], bool]:
        """The plan, and whether it was carried out (False: refused for its removals; nothing done)."""
        async with pgferry.connect(url, pool_size=1) as f, f.pool.acquire() as conn:

            async def once() -> tuple[list[applying.Change], bool]:
                try:
                    return await applying.run(conn, desired, prune=prune, dry_run=dry_run, allow_losses=allow), True
                except applying.RemovalsNotAllowed as exc:
                    return exc.changes, False

            # A relay's statement locks consumer rows in another order: the loser of a deadlock
            # is rolled back whole (the relay's statement tries again too; outside probe).
            return await db.again_if_rolled_back(once, "apply")

    changes, done = run_coroutine(go(yes or dry_run), url=url)
    shown: list[dict[str, Any]] = []
    if not done:
        summary = applying.removal_summary(changes)
        if as_json or not sys.stdin.isatty():
            if not as_json:
                _print_plan(changes)
            raise click.ClickException(f"the apply would remove {summary}: nothing changed; give --yes to apply it")
        _print_plan(changes)
        if not click.confirm(f"remove {summary}?", default=False):
            raise click.Abort()
        shown = [c.as_dict() for c in changes]
        confirmed = {c.name: (c.parked, c.dead) for c in changes if c.action == "remove"}
        changes, done = run_coroutine(go(confirmed), url=url)
        if not done:  # another apply, or events parked or dead since, changed it in the meantime
            raise click.ClickException("the plan changed while you were asked (another apply, or more parked "
                                       "retries or dead letters to remove); nothing changed: run it again")  # fmt: skip
    for change in changes:
        for stream in change.unwritten:
            click.echo(f"warning: {change.name}: {inspect.unwritten_warning(stream)}", err=True)
    if as_json:
        print_json({"dry_run": dry_run, "changes": [c.as_dict() for c in changes]})
        return
    if [c.as_dict() for c in changes] != shown:  # not the plan printed before the question
        _print_plan(changes)
    acted = [c for c in changes if c.action not in ("unchanged",)]
    summary = applying.removal_summary(changes)
    if dry_run:
        click.echo(f"dry run: {len(acted)} change(s) not applied" + (f"; it would remove {summary}" if summary else ""))
    else:
        done_text = f"applied {len(acted)} change(s)" if acted else "nothing to change"
        click.echo(done_text + (f"; removed {summary}" if summary else ""))


def _relays_table(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["liveness"] = "live" if row["live"] else f"silent {row['heartbeat_age_s']:.0f}s"
    columns = [("id", "relay"), ("hostname", "host"), ("pid", "pid"), ("started_at", "started"),
               ("liveness", "heartbeat"), ("owned", "delivers")]  # fmt: skip
    table("relays", rows, columns, styles={"liveness": lambda v: "green" if v == "live" else "yellow"})


def _wal_line(wal: dict[str, Any]) -> None:
    """WAL capture's slot: its lag, or what is wrong with it and the way out."""
    if wal["stopped"]:
        click.secho(f"WAL capture stopped: {wal['note'] or 'the replication slot is gone or invalidated'}", fg="red")
        return
    if wal["error"]:
        click.secho(f"WAL capture failing since {wal['error_at']:%Y-%m-%d %H:%M:%S%z}: {wal['error']}", fg="red")
    lag = f"{wal['lag_bytes']:,} bytes of WAL" + (f", {wal['lag_seconds']:.1f} s" if wal["lag_seconds"] else "")
    click.echo(f"WAL capture: slot {wal['slot_name']} ({wal['tables']} table(s)), behind by {lag}, "
               f"WAL {wal['wal_status']}")  # fmt: skip
    if wal.get("skip_lsns"):
        click.echo(f"  skip pending (ferry.skip_wal_change) at {', '.join(wal['skip_lsns'])}: a change there the log "
                   "cannot hold is left out at the next try")  # fmt: skip
    if wal["note"]:
        click.echo(f"  note: {wal['note']}")
    for problem in wal.get("identity_problems") or ():
        click.secho(f"  WAL capture of {problem}", fg="red")


def _retention_table(rows: list[dict[str, Any]]) -> None:
    """The consumers holding the log back (50% or 80% of the retention limit), stalled, or with gaps."""
    if not rows:
        return
    columns = [("consumer", "consumer"), ("level", "retention"), ("cursor_age", "cursor age"), ("held", "holds"),
               ("limit_pct", "of limit"), ("lost", "events lost"), ("why", "why")]  # fmt: skip
    table("retention: consumers holding the log back", rows, columns, styles={"level": _level_style})


def _level_style(value: str) -> str:
    return {"50%": "yellow", "80%": "red", "stalled": "red"}.get(value, "")


def _state_style(value: str) -> str:
    return {"active": "green", "paused": "yellow", "disabled": "red", "stalled": "red"}.get(value, "")


def _health_style(value: str) -> str:
    if value == "ok":
        return "green"
    if value.startswith("failing") or value == "disabled":
        return "red"
    return "yellow"


def _count_style(value: Any) -> str:
    return "red" if value else ""


_STATUS_STYLES: dict[str, Callable[[Any], str]] = {
    "state": _state_style,
    "health": _health_style,
    "dead": _count_style,
    "parked": lambda v: "yellow" if v else "",
}


_MARKS = {"create": ("+", "green"), "update": ("~", "yellow"), "adopt": ("~", "cyan"), "remove": ("-", "red"),
          "unchanged": ("=", "dim")}  # fmt: skip


def _print_plan(changes: list[Any]) -> None:
    for change in changes:
        mark, style = _MARKS[change.action]
        reason = f" ({change.reason})" if change.reason else ""
        console.print(f"[{style}]{mark} {change.action} {escape(change.name)}[/]{escape(reason)}")
        for key, (old, new) in change.fields.items():
            if old is None:
                console.print(f"    {key}: {new}", markup=False)
            else:
                console.print(f"    {key}: {old} -> {new}", markup=False)


def _trace_style(value: str) -> str:
    if value == "delivered":
        return "green"
    if value in ("dead",) or value.startswith(("passed (last attempt failed", "skipped: in gap")):
        return "red"
    if value.startswith("filtered out"):  # the subscription asked not to get it
        return "dim"
    return "yellow"


def _print_event(event: pgferry.Event, as_json: bool) -> None:
    if as_json:
        line = {
            "id": event.id,
            "stream": event.stream,
            "key": event.key,
            "created_at": event.created_at.isoformat(),
            "payload": event.payload,
            "headers": event.headers,
        }
        click.echo(orjson.dumps(line).decode())
        return
    payload = orjson.dumps(event.payload).decode()
    if len(payload) > 300:
        payload = payload[:300] + " …"
    console.print(
        f"[dim]{event.created_at:%H:%M:%S}[/] [bold]#{event.id}[/] [cyan]{escape(visible(event.stream))}[/] "
        f"{escape(visible(str(event.key or '-')))} {escape(payload)}",
        highlight=False,
        soft_wrap=True,
    )


@click.group()
def retention() -> None:
    """The retention limit: how far behind a consumer may fall before it stops holding the log back."""


@retention.command("show")
@database_url_option
@json_option
def retention_show(database_url: str | None, as_json: bool) -> None:
    """The limit, every consumer against it (cursor age, bytes it holds back, stalled or not, events
    lost) and the recorded gaps."""

    async def read(f: pgferry.Ferry) -> dict[str, Any]:
        async with f.pool.acquire() as conn:
            config = dict(await conn.fetchrow(sql.query("retention_config")))
            return {"config": config, "consumers": await inspect.retention_status(conn),
                    "gaps": await inspect.gaps(conn)}  # fmt: skip

    result = with_ferry(database_url, read)
    if as_json:
        print_json(result)
        return
    config = result["config"]
    cap = config["max_retention_bytes"]
    click.echo(f"max_retention {config['max_retention']}, max_retention_bytes "
               f"{'none' if cap is None else cap} (rotation_interval {config['rotation_interval']})")  # fmt: skip
    rows = inspect.holding_back(result["consumers"]) + [
        {**r, "summary": "ok", "cursor_age": "-", "held": "-", "limit_pct": "-", "lost": "0", "why": None}
        for r in result["consumers"] if r["level"] == "ok" and not r["gaps"]
    ]  # fmt: skip
    _retention_table(rows)
    if result["gaps"]:
        columns = [("id", "gap"), ("consumer", "consumer"), ("events", "events"), ("first_event_id", "first id"),
                   ("last_event_id", "last id"), ("oldest_event_at", "oldest"), ("newest_event_at", "newest"),
                   ("cause", "cause"), ("recorded_at", "recorded")]  # fmt: skip
        if any(g["from_lsn"] for g in result["gaps"]):  # WAL losses: their WAL range (migration 0025)
            columns[3:3] = [("from_lsn", "from LSN"), ("to_lsn", "to LSN")]
        if any(g["cause"] == "wal change skipped" for g in result["gaps"]):  # the row to backfill (migration 0037)
            columns.append(("reason", "why"))
        table("gaps (events consumers never got)", result["gaps"], columns)


@retention.command("set")
@database_url_option
@click.option("--max-age", required=True, help="How far behind in time, e.g. '7 days', '36 hours'.")
@click.option("--max-bytes", type=INT8, help="Size cap of the log in bytes (its partitions with indexes); "
              "left out: no size cap.")  # fmt: skip
def retention_set(database_url: str | None, max_age: str, max_bytes: int | None) -> None:
    """Set the retention limit (both values: leaving --max-bytes out removes the size cap)."""
    with naming("--max-age", INTERVAL_REFUSALS, INTERVAL_HINT):
        with_ferry(database_url, lambda f: f.set_retention(max_age, max_bytes))
    click.echo(f"retention limit: {max_age}" + (f", {max_bytes} bytes" if max_bytes is not None else ", no size cap"))
