"""`pgferry subscription ...`, `pgferry dlq ...` and `pgferry status`."""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click
import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

import pgferry
from pgferry.delivery.http import endpoint_of
from pgferry.delivery.signing import new_secret

T = TypeVar("T")

console = Console()


def with_ferry(database_url: str | None, action: Callable[[pgferry.Ferry], Awaitable[T]]) -> T:
    """Run ``action`` with a Ferry on the given database, as one CLI command."""
    from pgferry.cli import _run, require_url

    url = require_url(database_url)

    async def go() -> T:
        async with pgferry.connect(url, pool_size=2) as ferry:
            return await action(ferry)

    return _run(go())  # type: ignore[no-any-return]


def _print_json(rows: Any) -> None:
    click.echo(orjson.dumps(rows, default=str, option=orjson.OPT_INDENT_2).decode())


def _table(
    title: str,
    rows: list[dict[str, Any]],
    columns: list[tuple[str, str]],
    styles: dict[str, Callable[[Any], str]] | None = None,
) -> None:
    """A rich table; cells coloured by ``styles`` (rich leaves colour out when stdout is not a terminal)."""
    table = Table(title=title, title_justify="left")
    for _, header in columns:
        table.add_column(header, overflow="fold")
    styles = styles or {}
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            cell = _cell(value)
            if key in styles and value is not None:
                cell.stylize(styles[key](value))
            cells.append(cell)
        table.add_row(*cells)
    console.print(table)


def _cell(value: Any) -> Text:
    """Plain text, never rich markup: cells hold what receivers answered (reason phrases,
    Location headers), and "[/bold]" there must neither crash the command nor style the
    output; control characters are shown escaped so none reaches the terminal."""
    if value is None:
        text = "-"
    elif isinstance(value, list | tuple):
        text = ",".join(map(str, value))
    elif isinstance(value, float):
        text = f"{value:.1f}"
    elif isinstance(value, datetime):
        text = f"{value:%Y-%m-%d %H:%M:%S}"
    else:
        text = str(value)
    return Text("".join(c if c.isprintable() else repr(c)[1:-1] for c in text))


def register(main: click.Group, database_url_option: Callable[[Any], Any]) -> None:
    json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")

    @main.group()
    def subscription() -> None:
        """Manage webhook subscriptions (streams -> URL)."""

    @subscription.command("add")
    @database_url_option
    @click.argument("name")
    @click.option("--url", required=True, help="Endpoint URL (http or https).")
    @click.option("--stream", "streams", multiple=True, required=True, help="Stream to deliver (repeatable).")
    @click.option("--batch-size", default=1, show_default=True, help='Events per request; >1 sends {"data": [...]}.')
    @click.option("--max-in-flight", default=32, show_default=True, help="Requests in flight at once.")
    @click.option(
        "--ordered", is_flag=True, help="Keep per-key order (later events of a key wait behind a failed one)."
    )
    @click.option(
        "--secret",
        envvar="PGFERRY_WEBHOOK_SECRET",
        help="Signing secret (whsec_...), or - to read it from stdin (keeps it out of `ps` and shell history); "
        "or set PGFERRY_WEBHOOK_SECRET. See `pgferry subscription secret`.",
    )
    @click.option("--header", "headers", multiple=True, metavar="NAME=VALUE", help="Extra header (repeatable).")
    @click.option("--timeout-ms", default=10000, show_default=True)
    @click.option("--max-attempts", default=12, show_default=True)
    @click.option("--max-age", default="3 days", show_default=True, help="Give up (dead letter) after this long.")
    @click.option("--retry-base-ms", default=1000, show_default=True)
    @click.option("--retry-max-ms", default=600000, show_default=True)
    @click.option("--from-beginning", is_flag=True, help="Also deliver the retained history, not only new events.")
    def add(database_url: str | None, name: str, url: str, streams: tuple[str, ...], headers: tuple[str, ...],
            from_beginning: bool, **options: Any) -> None:  # fmt: skip
        """Create or update subscription NAME."""
        header_map = {}
        for item in headers:
            key, sep, value = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--header")
            header_map[key.strip()] = value.strip()
        if options.get("secret") == "-":
            options["secret"] = sys.stdin.readline().strip()
        _warn_unresolvable(url)
        unwritten = with_ferry(
            database_url,
            lambda f: f.subscribe(
                name, streams, url, headers=header_map, start_at="beginning" if from_beginning else "now", **options
            ),
        )
        click.echo(f"subscription {name} -> {url} saved")
        _warn_unwritten(unwritten)

    @subscription.command("list")
    @database_url_option
    @json_option
    def list_(database_url: str | None, as_json: bool) -> None:
        """List subscriptions and their settings (secrets and header values are never shown)."""
        rows = with_ferry(database_url, lambda f: f.subscriptions())
        for row in rows:
            # Header values often are credentials (Authorization, API keys): names only.
            row["headers"] = {name: "***" for name in row.get("headers") or {}}
            row["url"] = re.sub(r"\?.*$", "?…", row["url"])  # query strings often carry tokens
        if as_json:
            _print_json(rows)
            return
        columns = [("name", "name"), ("state", "state"), ("streams", "streams"), ("url", "url"),
                   ("batch_size", "batch"), ("max_in_flight", "in flight"), ("ordered", "ordered"),
                   ("secrets", "secrets"), ("max_attempts", "attempts"), ("state_reason", "reason")]  # fmt: skip
        _table("subscriptions", rows, columns)

    for verb, method, done in (("pause", "pause", "paused"), ("resume", "resume", "resumed"),
                               ("remove", "unsubscribe", "removed")):  # fmt: skip

        def make(method: str = method, done: str = done) -> Callable[..., None]:
            def command(database_url: str | None, name: str) -> None:
                with_ferry(database_url, lambda f: getattr(f, method)(name))
                click.echo(f"subscription {name} {done}")

            return command

        cmd = make()
        cmd.__doc__ = f"{verb.capitalize()} subscription NAME."
        subscription.command(verb)(database_url_option(click.argument("name")(cmd)))

    @subscription.command("secret")
    def secret() -> None:
        """Print a new random signing secret (whsec_...)."""
        click.echo(new_secret())

    @main.group()
    def dlq() -> None:
        """Dead letters: events that ran out of attempts."""

    @dlq.command("list")
    @database_url_option
    @click.option("--subscription", help="Only this subscription.")
    @click.option("--limit", default=100, show_default=True)
    @json_option
    def dlq_list(database_url: str | None, subscription: str | None, limit: int, as_json: bool) -> None:
        """List dead letters with their last error."""
        rows = with_ferry(database_url, lambda f: f.dead_letters(subscription, limit))
        if as_json:
            _print_json(rows)
            return
        columns = [("id", "id"), ("subscription", "subscription"), ("event_id", "event"), ("attempts", "attempts"),
                   ("last_status", "status"), ("last_error", "last error"), ("died_at", "died at")]  # fmt: skip
        _table("dead letters", rows, columns)

    @dlq.command("replay")
    @database_url_option
    @click.argument("subscription")
    @click.option("--id", "ids", multiple=True, type=int, help="Dead letter id (repeatable); default: all.")
    def dlq_replay(database_url: str | None, subscription: str, ids: tuple[int, ...]) -> None:
        """Queue dead letters of SUBSCRIPTION for delivery again."""
        n = with_ferry(database_url, lambda f: f.replay_dead_letters(subscription, ids or None))
        click.echo(f"{n} dead letter(s) queued for delivery")

    @dlq.command("discard")
    @database_url_option
    @click.argument("subscription")
    @click.option("--id", "ids", multiple=True, type=int, help="Dead letter id (repeatable); default: all.")
    def dlq_discard(database_url: str | None, subscription: str, ids: tuple[int, ...]) -> None:
        """Delete dead letters of SUBSCRIPTION for good."""
        n = with_ferry(database_url, lambda f: f.discard_dead_letters(subscription, ids or None))
        click.echo(f"{n} dead letter(s) discarded")

    @dlq.command("show")
    @database_url_option
    @click.argument("letter_id", type=int)
    @json_option
    def dlq_show(database_url: str | None, letter_id: int, as_json: bool) -> None:
        """Show dead letter LETTER_ID in full: event, last error and response, every attempt."""
        from pgferry.ops import inspect

        letter = with_ferry(database_url, lambda f: _on_conn(f, lambda c: inspect.dead_letter(c, letter_id)))
        if as_json:
            _print_json(letter)
            return
        console.print(f"[bold]dead letter {letter['id']}[/] of subscription [bold]{_escape(letter['subscription'])}[/]:"
                      f" event {letter['event_id']} on stream {_escape(letter['stream'])}"
                      f" (key {_escape(str(letter['key'] or '-'))})")  # fmt: skip
        console.print(f"created {_cell(letter['event_created_at'])}, first failed {_cell(letter['first_failed_at'])}, "
                      f"died {_cell(letter['died_at'])} after {letter['attempts']} attempt(s)")  # fmt: skip
        console.print(
            f"last error: [red]{_escape(letter['last_error'] or '-')}[/] (status {_cell(letter['last_status'])})"
        )
        console.print("last response:", _escape(letter["last_response"] or "-"), markup=False)
        console.print("payload:", orjson.dumps(letter["payload"]).decode(), markup=False)
        _attempts_table(letter["attempt_history"])
        console.print(f"replay it with: pgferry dlq replay {letter['subscription']} --id {letter['id']}", markup=False)

    @main.command()
    @database_url_option
    @json_option
    def status(database_url: str | None, as_json: bool) -> None:
        """Per subscription: lag, rate, in flight, parked, dead, error rate, endpoint health, owning relay;
        then every relay and what it owns. --json: the subscriptions (relays: `pgferry relays --json`)."""
        from pgferry.ops import inspect

        async def read(f: pgferry.Ferry) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            async with f.pool.acquire() as conn:
                return await inspect.subscription_status(conn), await inspect.relays(conn)

        rows, relay_rows = with_ferry(database_url, read)
        if as_json:
            _print_json(rows)
            return
        columns = [("name", "subscription"), ("state", "state"), ("lag_events", "lag (events)"),
                   ("lag_seconds", "lag (s)"), ("rate", "delivered"), ("in_flight", "in flight"), ("parked", "parked"),
                   ("dead", "dead"), ("error_rate", "errors (5m)"), ("health", "endpoint"),
                   ("owner", "relay")]  # fmt: skip
        _table("delivery status", rows, columns, styles=_STATUS_STYLES)
        _relays_table(relay_rows)

    @main.command()
    @database_url_option
    @json_option
    def relays(database_url: str | None, as_json: bool) -> None:
        """Relay processes: host, pid, heartbeat, live or not, and the subscriptions each delivers."""
        from pgferry.ops import inspect

        rows = with_ferry(database_url, lambda f: _on_conn(f, inspect.relays))
        if as_json:
            _print_json(rows)
            return
        _relays_table(rows)


def _relays_table(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["liveness"] = "live" if row["live"] else f"silent {row['heartbeat_age_s']:.0f}s"
    columns = [("id", "relay"), ("hostname", "host"), ("pid", "pid"), ("started_at", "started"),
               ("liveness", "heartbeat"), ("owned", "delivers")]  # fmt: skip
    _table("relays", rows, columns, styles={"liveness": lambda v: "green" if v == "live" else "yellow"})


def _attempts_table(rows: list[dict[str, Any]], title: str = "attempts") -> None:
    for row in rows:
        row["outcome"] = "ok" if row["error_class"] is None else row["error_class"]
    columns = [("subscription", "subscription"), ("attempt", "#"), ("created_at", "at"), ("status", "status"),
               ("outcome", "outcome"), ("latency_ms", "ms"), ("error", "error"), ("response", "response")]  # fmt: skip
    _table(title, rows, columns, styles={"outcome": lambda v: "green" if v == "ok" else "red"})


async def _on_conn(f: pgferry.Ferry, action: Callable[[Any], Awaitable[T]]) -> T:
    async with f.pool.acquire() as conn:
        return await action(conn)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _state_style(value: str) -> str:
    return {"active": "green", "paused": "yellow", "disabled": "red"}.get(value, "")


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


def _warn_unwritten(streams: list[str]) -> None:
    """One warning line per stream nothing has written yet (ferry.subscribe's NOTICE)."""
    from pgferry.ops.inspect import unwritten_warning

    for stream in streams:
        click.echo(f"warning: {unwritten_warning(stream)}", err=True)


def _warn_unresolvable(url: str) -> None:
    _, host, port = endpoint_of(url)
    if not host:
        return
    try:
        socket.getaddrinfo(host, port)
    except (OSError, UnicodeError) as exc:
        click.echo(
            f"warning: cannot resolve {host!r} from here ({exc}); deliveries will fail until it resolves", err=True
        )
