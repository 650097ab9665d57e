"""`pgferry subscription ...`: subscriptions (streams -> a webhook URL, a NATS subject or a Redis stream)."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import click
from click.core import ParameterSource

import pgferry
from pgferry.cli.common import (
    INTERVAL_HINT,
    INTERVAL_REFUSALS,
    database_url_option,
    json_option,
    naming,
    print_json,
    table,
    with_ferry,
)
from pgferry.delivery.destinations import shown_url
from pgferry.delivery.http import endpoint_of
from pgferry.delivery.signing import new_secret
from pgferry.ops.inspect import no_such_subscription, unwritten_warning
from pgferry.params import INT4


@click.group()
def subscription() -> None:
    """Manage subscriptions (streams -> webhook URL, NATS JetStream subject or Redis stream)."""


#: What `subscription add` keeps of an existing subscription when it is not given.
KEPT_SETTINGS = ("batch_size", "max_in_flight", "ordered", "timeout_ms", "max_attempts", "max_age", "retry_base_ms",
                 "retry_max_ms", "filter", "partitions")  # fmt: skip


@subscription.command("add")
@database_url_option
@click.argument("name")
@click.option("--url", required=True,
              help="Where to deliver: http(s)://... (webhook), nats://host:4222/<subject> (JetStream) or "
                   "redis://host:6379/<db>?stream=<name> (Redis Streams); subjects and streams may use {stream} "
                   "and {key}. Broker credentials: `pgferry subscription credentials`.")  # fmt: skip
@click.option("--stream", "streams", multiple=True, required=True, help="Stream to deliver (repeatable).")
@click.option(
    "--batch-size",
    default=1,
    show_default=True,
    type=click.IntRange(1, 1000),
    help='Events per request; >1 sends {"data": [...]}.',
)
@click.option("--max-in-flight", default=32, show_default=True, type=click.IntRange(1, 1000),
              help="Requests in flight at once.")  # fmt: skip
@click.option("--ordered/--no-ordered", default=False,
              help="Keep per-key order (later events of a key wait behind a failed one), or not; an existing "
                   "subscription keeps its setting unless one is given.")  # fmt: skip
@click.option(
    "--secret",
    envvar="PGFERRY_WEBHOOK_SECRET",
    help="Signing secret (whsec_...), or - to read it from stdin (keeps it out of `ps` and shell history); "
    "or set PGFERRY_WEBHOOK_SECRET. See `pgferry subscription secret`.",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME=VALUE",
    help="Extra header (repeatable); on an existing subscription the headers given replace all of its own.",
)
@click.option("--clear-headers", is_flag=True, help="Remove every extra header of an existing subscription.")
@click.option("--timeout-ms", default=10000, show_default=True, type=INT4)
@click.option("--max-attempts", default=12, show_default=True, type=click.IntRange(1, 1000))
@click.option("--max-age", default="3 days", show_default=True, help="Give up (dead letter) after this long.")
@click.option("--retry-base-ms", default=1000, show_default=True, type=INT4)
@click.option("--retry-max-ms", default=600000, show_default=True, type=INT4)
@click.option("--from-beginning", is_flag=True, help="Also deliver the retained history, not only new events.")
@click.option(
    "--filter",
    metavar="JSONPATH",
    help="Send only events for which this jsonpath predicate is true: the payload is $, and $stream, $key, "
    "$headers the rest of the event (e.g. '$.record.amount > 100'). --filter '' removes a filter set before.",
)
@click.option("--partitions", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Spread the events over N partitions by key hash, each delivered by its own worker on any "
                   "relay process (per-key order holds); changing it on a live subscription is safe.")  # fmt: skip
def add(database_url: str | None, name: str, url: str, streams: tuple[str, ...], headers: tuple[str, ...],
        clear_headers: bool, from_beginning: bool, **options: Any) -> None:  # fmt: skip
    """Create or update subscription NAME. On an existing one, settings not given keep their
    values (--header: all of them, given or kept; --clear-headers: none; --no-ordered turns
    ordering off; --filter '': no filter)."""
    if clear_headers and headers:
        raise click.UsageError("give --clear-headers and --header apart: --header already replaces every header")
    header_map = {}
    for item in headers:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(
                f"{item!r} is not NAME=VALUE" + ("; --clear-headers removes every header" if not item.strip() else ""),
                param_hint="--header",
            )
        header_map[key.strip()] = value.strip()
    if options.get("secret") == "-":
        options["secret"] = sys.stdin.readline().strip()
    current = next((r for r in with_ferry(database_url, lambda f: f.subscriptions()) if r["name"] == name), None)
    if current is not None:
        # Reset to the defaults, `subscription add NAME --partitions 4` (the docs' example) turned
        # ordering off and dropped its headers and filter, without a word (outside probe).
        context = click.get_current_context()
        for option in KEPT_SETTINGS:
            if context.get_parameter_source(option) is ParameterSource.DEFAULT:
                options[option] = current[option]
        options["connect_timeout_ms"] = current["connect_timeout_ms"]  # no option of its own: set by SQL or apply
        if not headers and not clear_headers:
            header_map = dict(current["headers"] or {})
    if options.get("filter") == "":
        options["filter"] = None
    with naming("--max-age", INTERVAL_REFUSALS, INTERVAL_HINT):
        unwritten = with_ferry(
            database_url,
            lambda f: f.subscribe(
                name, streams, url, headers=header_map, start_at="beginning" if from_beginning else "now", **options
            ),
        )
    click.echo(f"subscription {name} -> {url} saved")
    _warn_unresolvable(url)  # after the save: a URL ferry.subscribe refuses needs no other warning
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
        row["url"] = shown_url(row["url"])
    if as_json:
        print_json(rows)
        return
    columns = [("name", "name"), ("state", "state"), ("streams", "streams"), ("url", "url"),
               ("batch_size", "batch"), ("max_in_flight", "in flight"), ("ordered", "ordered"),
               ("secrets", "secrets"), ("max_attempts", "attempts"), ("partitions", "partitions"), ("filter", "filter"),
               ("state_reason", "reason")]  # fmt: skip
    table("subscriptions", rows, columns)


@subscription.command("pause")
@database_url_option
@click.argument("name")
def pause(database_url: str | None, name: str) -> None:
    """Pause subscription NAME."""
    with_ferry(database_url, lambda f: f.pause(name))
    click.echo(f"subscription {name} paused")


@subscription.command("resume")
@database_url_option
@click.argument("name")
@click.option("--from", "from_position", type=click.Choice(["retained", "now"]),
              help="Where a stalled subscription reads on: 'retained' (every event still in the log, from the "
                   "oldest) or 'now' (the retained backlog skipped and recorded as a gap; `pgferry replay` can "
                   "still send it). Required for a stalled subscription.")  # fmt: skip
def resume(database_url: str | None, name: str, from_position: str | None) -> None:
    """Resume subscription NAME (paused, disabled, or stalled by the retention limit).

    --from now on one that is not stalled skips its unread events too (recorded as a gap);
    --from retained moves only a stalled one."""

    async def go(f: pgferry.Ferry) -> str | None:
        """The state it was in (None: no such subscription; resume says so)."""
        before = next((row["state"] for row in await f.subscriptions() if row["name"] == name), None)
        await f.resume(name, from_position)
        return before

    click.echo(_resumed(name, with_ferry(database_url, go), from_position))


def _resumed(name: str, before: str | None, from_position: str | None) -> str:
    """What `subscription resume` did: "resumed from the oldest retained event" of one that was not
    stalled, which moved nothing, misled (outside verifier)."""
    stalled, active = before == "stalled", before == "active"
    if from_position == "now":
        what = "the retained backlog was" if stalled else "events it had not read were"
        done = "was active; it reads on" if active else "resumed"
        replay = "(`pgferry replay` can still send them)"
        return f"subscription {name} {done} from now: {what} skipped, recorded as a gap {replay}"
    if from_position == "retained" and not stalled:
        if active:
            return (
                f"subscription {name} was active and not stalled: nothing changed (--from retained moves only a "
                "stalled subscription's cursor)"
            )
        moved = "it was not stalled: --from retained moved nothing"
        return f"subscription {name} resumed from where it was {before} ({moved})"
    if from_position == "retained":
        return f"subscription {name} resumed from the oldest retained event"
    return f"subscription {name} was active already: nothing changed" if active else f"subscription {name} resumed"


@subscription.command("remove")
@database_url_option
@click.argument("name")
def remove(database_url: str | None, name: str) -> None:
    """Remove subscription NAME, with its cursor, parked retries and dead letters."""
    if not with_ferry(database_url, lambda f: f.unsubscribe(name)):  # False: there was none to remove
        raise click.ClickException(no_such_subscription(name))
    click.echo(f"subscription {name} removed")


@subscription.command("credentials")
@database_url_option
@click.argument("name")
@click.option("--user", help="User name (NATS or Redis ACL user).")
@click.option("--password-env", metavar="VAR", help="Read the password from this environment variable.")
@click.option("--token-env", metavar="VAR", help="Read a NATS token from this environment variable.")
@click.option("--creds-file", metavar="PATH", help="A NATS .creds file, read by the relay.")
@click.option("--clear", is_flag=True, help="Remove the credentials.")
def credentials(database_url: str | None, name: str, user: str | None, password_env: str | None,
                token_env: str | None, creds_file: str | None, clear: bool) -> None:  # fmt: skip
    """Set the credentials broker subscription NAME connects with (never shown by status or list).

    Secrets come from environment variables, never from the command line (`ps`, shell history).
    """
    values: dict[str, str] = {}
    if user is not None:
        values["user"] = user
    for key, var in (("password", password_env), ("token", token_env)):
        if var is not None:
            if var not in os.environ:
                raise click.BadParameter(f"environment variable {var} is not set", param_hint=f"--{key}-env")
            values[key] = os.environ[var]
    if creds_file is not None:
        values["creds_file"] = creds_file
    if clear == bool(values):
        raise click.UsageError("give --user/--password-env, --token-env or --creds-file, or --clear alone")
    with_ferry(database_url, lambda f: f.set_credentials(name, values or None))
    click.echo(f"subscription {name}: credentials {'removed' if clear else 'set (' + ', '.join(values) + ')'}")


@subscription.command("secret")
def secret() -> None:
    """Print a new random signing secret (whsec_...)."""
    click.echo(new_secret())


def _warn_unwritten(streams: list[str]) -> None:
    """One warning line per stream nothing has written yet (ferry.subscribe's NOTICE)."""
    for stream in streams:
        click.echo(f"warning: {unwritten_warning(stream)}", err=True)


def _warn_unresolvable(url: str) -> None:
    try:
        _, host, port = endpoint_of(url)
    except ValueError:  # malformed: ferry.subscribe says what is wrong with it
        return
    if not host:
        return
    try:
        socket.getaddrinfo(host, port)
    except (OSError, UnicodeError) as exc:
        click.echo(
            f"warning: cannot resolve {host!r} from here ({exc}); deliveries will fail until it resolves", err=True
        )
