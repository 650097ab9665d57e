"""`pgferry capture ...`: capture a table's row changes into a stream, by trigger or from the WAL."""

from __future__ import annotations

import warnings

import click

from pgferry.cli.common import database_url_option, with_ferry
from pgferry.errors import CaptureWarning


@click.command()
@database_url_option
@click.argument("table")
@click.option("--stream", help="The stream its events go to (default: schema.table).")
@click.option("--method", type=click.Choice(["trigger", "wal"]), default="trigger", show_default=True,
              help="trigger: statement triggers write events in the writer's transaction; wal: the relay decodes "
                   "them from the write-ahead log (needs wal_level = logical; TRUNCATE is captured too).")  # fmt: skip
@click.option("--key-column", "key_columns", multiple=True, help="Key column (repeatable; default: the primary key).")
@click.option("--condition", help="Capture only rows for which this SQL expression is true (e.g. \"status = 'paid'\").")
@click.option("--column", "columns", multiple=True, help="Keep only these columns in the record (repeatable).")
@click.option("--exclude-column", "exclude_columns", multiple=True, help="Leave these columns out (repeatable).")
@click.option("--changed-column", "changed_columns", multiple=True,
              help="Capture an UPDATE only when one of these columns changed (repeatable).")  # fmt: skip
@click.option("--operation", "operations", multiple=True, type=click.Choice(["insert", "update", "delete"]),
              help="Capture only these operations (repeatable; default: all three).")  # fmt: skip
@click.option("--remove", is_flag=True, help="Stop capturing TABLE instead.")
def capture(
    database_url: str | None,
    table: str,
    stream: str | None,
    method: str,
    key_columns: tuple[str, ...],
    condition: str | None,
    columns: tuple[str, ...],
    exclude_columns: tuple[str, ...],
    changed_columns: tuple[str, ...],
    operations: tuple[str, ...],
    remove: bool,
) -> None:
    """Capture TABLE's inserts, updates and deletes into a stream (or stop, with --remove)."""
    if remove:
        if (
            stream
            or method != "trigger"
            or key_columns
            or condition
            or columns
            or exclude_columns
            or changed_columns
            or operations
        ):
            raise click.UsageError("--remove takes only TABLE (the other options say how to capture it)")
        if not with_ferry(database_url, lambda f: f.uncapture_table(table)):
            raise click.ClickException(f"{table} is not captured (see `pgferry status`: captured tables)")
        click.echo(f"{table} is no longer captured")
        return
    with warnings.catch_warnings(record=True) as noted:
        warnings.simplefilter("always", CaptureWarning)
        name = with_ferry(
            database_url,
            lambda f: f.capture_table(
                table,
                stream=stream,
                method=method,
                key_columns=key_columns or None,
                condition=condition,
                columns=columns or None,
                exclude_columns=exclude_columns or None,
                changed_columns=changed_columns or None,
                operations=operations or None,
            ),
        )
    how = "from the WAL (the relay decodes it)" if method == "wal" else "by trigger"
    click.echo(f"{table} is captured {how} into stream {name}")
    for warning in noted:
        if issubclass(warning.category, CaptureWarning):
            click.echo(f"warning: {warning.message}", err=True)
