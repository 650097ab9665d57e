"""`pgferry dlq ...`: dead letters, events that ran out of attempts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import orjson

import pgferry
from pgferry.cli.common import (
    attempts_table,
    cell,
    console,
    database_url_option,
    escape,
    json_option,
    on_conn,
    print_json,
    table,
    visible,
    with_ferry,
)
from pgferry.ops import inspect
from pgferry.params import INT8

T = TypeVar("T")


async def _known(f: pgferry.Ferry, subscription: str | None, action: Callable[[], Awaitable[T]]) -> T:
    """``action``'s answer, once SUBSCRIPTION (if given) is known to exist: of an unknown one the
    answer is empty, and "0 dead letter(s) queued" with exit 0 hid a typo."""
    if subscription is not None:
        await on_conn(f, lambda c: inspect.require_subscription(c, subscription))
    return await action()


@click.group()
def dlq() -> None:
    """Dead letters: events that ran out of attempts."""


@dlq.command("list")
@database_url_option
@click.option("--subscription", help="Only this subscription.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1))
@json_option
def dlq_list(database_url: str | None, subscription: str | None, limit: int, as_json: bool) -> None:
    """List dead letters with their last error."""
    rows = with_ferry(database_url, lambda f: _known(f, subscription, lambda: f.dead_letters(subscription, limit)))
    if as_json:
        print_json(rows)
        return
    columns = [("id", "id"), ("subscription", "subscription"), ("event_id", "event"), ("attempts", "attempts"),
               ("last_status", "status"), ("last_error", "last error"), ("died_at", "died at")]  # fmt: skip
    table("dead letters", rows, columns)


@dlq.command("replay")
@database_url_option
@click.argument("subscription")
@click.option("--id", "ids", multiple=True, type=INT8, help="Dead letter id (repeatable); default: all.")
def dlq_replay(database_url: str | None, subscription: str, ids: tuple[int, ...]) -> None:
    """Queue dead letters of SUBSCRIPTION for delivery again."""
    n = with_ferry(
        database_url, lambda f: _known(f, subscription, lambda: f.replay_dead_letters(subscription, ids or None))
    )
    if ids and n < len(set(ids)):  # "0 dead letter(s) queued", exit 0, hid a mistyped id (outside probe)
        raise click.ClickException(
            f"{n} of the {len(set(ids))} dead letter(s) asked for queued: the others are not dead letters of "
            f"{subscription!r}, or their events are queued for a retry already (see `pgferry dlq list "
            f"--subscription {subscription}`)"
        )
    click.echo(f"{n} dead letter(s) queued for delivery")


@dlq.command("discard")
@database_url_option
@click.argument("subscription")
@click.option("--id", "ids", multiple=True, type=INT8, help="Dead letter id (repeatable); default: all.")
def dlq_discard(database_url: str | None, subscription: str, ids: tuple[int, ...]) -> None:
    """Delete dead letters of SUBSCRIPTION for good."""
    n = with_ferry(
        database_url, lambda f: _known(f, subscription, lambda: f.discard_dead_letters(subscription, ids or None))
    )
    if ids and n < len(set(ids)):  # "0 dead letter(s) discarded", exit 0, hid a mistyped id (outside verifier)
        raise click.ClickException(
            f"{n} of the {len(set(ids))} dead letter(s) asked for discarded: the others are not dead letters of "
            f"{subscription!r} (see `pgferry dlq list --subscription {subscription}`)"
        )
    click.echo(f"{n} dead letter(s) discarded")


@dlq.command("show")
@database_url_option
@click.argument("letter_id", type=INT8)
@json_option
def dlq_show(database_url: str | None, letter_id: int, as_json: bool) -> None:
    """Show dead letter LETTER_ID in full: event, last error and response, every attempt."""
    letter = with_ferry(database_url, lambda f: on_conn(f, lambda c: inspect.dead_letter(c, letter_id)))
    if as_json:
        print_json(letter)
        return
    console.print(f"[bold]dead letter {letter['id']}[/] of subscription [bold]{escape(letter['subscription'])}[/]:"
                  f" event {letter['event_id']} on stream {escape(visible(letter['stream']))}"
                  f" (key {escape(visible(str(letter['key'] or '-')))})")  # fmt: skip
    console.print(f"created {cell(letter['event_created_at'])}, first failed {cell(letter['first_failed_at'])}, "
                  f"died {cell(letter['died_at'])} after {letter['attempts']} attempt(s)")  # fmt: skip
    console.print(f"last error: [red]{escape(visible(letter['last_error'] or '-'))}[/] "
                  f"(status {cell(letter['last_status'])})")  # fmt: skip
    console.print("last response:", visible(letter["last_response"] or "-"), markup=False)
    console.print("payload:", orjson.dumps(letter["payload"]).decode(), markup=False)
    attempts_table(letter["attempt_history"])
    console.print(f"replay it with: pgferry dlq replay {letter['subscription']} --id {letter['id']}", markup=False)
