"""`pgferry token ...`: bearer tokens of the streams HTTP API (`pgferry run --api-port`)."""

from __future__ import annotations

import click

from pgferry import api_tokens
from pgferry.cli.common import database_url_option, json_option, on_conn, print_json, table, with_ferry
from pgferry.errors import InvalidTokenPattern


@click.group()
def token() -> None:
    """Bearer tokens of the streams HTTP API, each allowed to read and/or write the streams its patterns match."""


@token.command("create")
@database_url_option
@click.argument("name")
@click.option("--read", "read", multiple=True, metavar="PATTERN", help="Streams it may read (repeatable).")
@click.option("--write", "write", multiple=True, metavar="PATTERN", help="Streams it may publish to (repeatable).")
def create(database_url: str | None, name: str, read: tuple[str, ...], write: tuple[str, ...]) -> None:
    """Create token NAME and print it, once.

    A PATTERN is a stream name in which * stands for any run of characters (. and : included) and ?
    for one character; * alone is every stream. Case-sensitive. Quote patterns from the shell.
    """
    if not read and not write:
        raise click.UsageError("give at least one --read or --write PATTERN (--read '*' reads every stream)")
    try:
        api_tokens.check_patterns(read, "read")
        api_tokens.check_patterns(write, "write")
    except InvalidTokenPattern as exc:  # before connecting
        raise click.ClickException(str(exc)) from exc
    secret = with_ferry(database_url, lambda f: on_conn(f, lambda c: api_tokens.create(c, name, read, write)))
    click.echo(secret)
    click.echo(f"token {name} created; it is shown only this once and cannot be shown again: store it now", err=True)


@token.command("list")
@database_url_option
@click.option("--all", "include_revoked", is_flag=True, help="Also revoked tokens.")
@json_option
def list_(database_url: str | None, include_revoked: bool, as_json: bool) -> None:
    """List tokens: names, patterns and dates (never a token or its hash)."""
    rows = with_ferry(database_url, lambda f: on_conn(f, lambda c: api_tokens.list_tokens(c, include_revoked)))
    if as_json:
        print_json(rows)
        return
    for row in rows:
        row["read_patterns"] = row["read_patterns"] or None  # shown as -
        row["write_patterns"] = row["write_patterns"] or None
    columns = [("name", "name"), ("read_patterns", "read"), ("write_patterns", "write"), ("created_at", "created"),
               ("created_by", "by"), ("last_used_at", "last used")]  # fmt: skip
    if include_revoked:
        columns.append(("revoked_at", "revoked"))
    table("API tokens", rows, columns)


@token.command("revoke")
@database_url_option
@click.argument("name")
def revoke(database_url: str | None, name: str) -> None:
    """Revoke token NAME: relays refuse it within seconds."""
    with_ferry(database_url, lambda f: on_conn(f, lambda c: api_tokens.revoke(c, name)))
    click.echo(f"token {name} revoked")
