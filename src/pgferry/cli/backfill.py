"""`pgferry backfill`: start, drive (with a progress bar), list, pause, resume and cancel backfills."""

from __future__ import annotations

import time
from collections.abc import Callable

import click

import pgferry
from pgferry.capture import backfill as backfills
from pgferry.cli.common import (
    BACKFILL_COLUMNS,
    backfill_rows,
    console,
    database_url_option,
    json_option,
    print_json,
    require_url,
    run_coroutine,
    table,
)
from pgferry.ops.backfill import drive
from pgferry.params import FiniteFloatRange


def _report(p: backfills.Progress, as_json: bool, run_rate: float | None = None) -> None:
    """``run_rate``: of the chunks this process ran (the backfill's own rate counts from its start,
    so a detached one that waited an hour reported 27 rows/s; outside probe)."""
    if as_json:
        print_json(p.as_dict())
    elif p.state == "done":
        rows_per_s = run_rate if run_rate is not None else p.rate
        rate = f" ({rows_per_s:,.0f} rows/s)" if rows_per_s is not None else ""
        click.echo(f"backfill {p.id} of {p.table}: done, {p.rows_done:,} rows{rate}")
    elif p.state == "paused":
        click.echo(f"backfill {p.id} of {p.table}: paused after {p.rows_done:,} rows; "
                   f"go on with `pgferry backfill --resume {p.id}`")  # fmt: skip
    else:
        click.echo(f"backfill {p.id} of {p.table}: {p.state} after {p.rows_done:,} rows")
    if p.state == "failed":
        if "start a new backfill" in (p.reason or ""):  # a resume cannot get past it (its target went, ...)
            raise click.ClickException(f"backfill {p.id} failed: {p.reason}")
        raise click.ClickException(
            f"backfill {p.id} failed: {p.reason}; fix the cause, then `pgferry backfill --resume {p.id}` "
            "(a condition cannot be changed: if it is the cause, start a new backfill)"
        )


#: Exit status of a run that stopped before the end: paused (Ctrl-C, SIGTERM, `--pause ID` from
#: elsewhere) or cancelled. It exited 0 after "paused ...", and a script could not tell (outside review).
EXIT_UNFINISHED = 3

#: a backfill's id (a bigint): a larger number was a traceback from asyncpg
BACKFILL_ID = click.IntRange(1, 2**63 - 1)


@click.command()
@database_url_option
@click.argument("table_name", metavar="TABLE", required=False)
@click.option("--subscription", help="Send the rows to this subscription only (default: every reader).")
@click.option("--consumer", help="Send the rows to this consumer (stream reader) only.")
@click.option("--where", "condition", metavar="SQL", help='Only rows matching this SQL condition, e.g. "paid".')
@click.option(
    "--chunk",
    type=click.IntRange(1, 1_000_000),
    default=None,
    help=f"Rows per chunk transaction (default {backfills.DEFAULT_CHUNK:,}).",
)
@click.option("--max-rate", type=FiniteFloatRange(1), default=None, metavar="ROWS/S",
              help="At most this many rows per second, to leave the table's writers more room.")  # fmt: skip
@click.option("--detach", is_flag=True, help="Only record it; run it later with --resume ID.")
@click.option("--list", "list_", is_flag=True, help="Backfills running, paused or finished in the last day.")
@click.option(
    "--resume", type=BACKFILL_ID, metavar="ID", help="Run a paused, failed or orphaned backfill from its last chunk."
)
@click.option("--pause", type=BACKFILL_ID, metavar="ID", help="Pause a backfill after the chunk in progress.")
@click.option("--cancel", type=BACKFILL_ID, metavar="ID", help="Cancel a backfill after the chunk in progress.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@json_option
def backfill(
    database_url: str | None,
    table_name: str | None,
    subscription: str | None,
    consumer: str | None,
    condition: str | None,
    chunk: int | None,
    max_rate: float | None,
    detach: bool,
    list_: bool,
    resume: int | None,
    pause: int | None,
    cancel: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Send the rows TABLE holds now as READ events of its capture's stream, in primary-key order,
    in short chunk transactions ordered against live writes (docs/backfills.md). This process runs
    the chunks and shows progress; if it dies, `--resume ID` goes on from the last chunk.

    Exit status of TABLE and --resume: 0 done, 1 failed, 3 stopped before the end (paused by Ctrl-C,
    SIGTERM or --pause, or cancelled)."""
    actions = [a for a in (table_name, list_ or None, resume, pause, cancel) if a is not None]
    if len(actions) != 1:
        raise click.UsageError("give one of TABLE, --list, --resume ID, --pause ID or --cancel ID")
    if table_name is None and (subscription or consumer or condition or detach):
        raise click.UsageError("--subscription, --consumer, --where and --detach go with TABLE")
    if chunk is not None and table_name is None and resume is None:
        raise click.UsageError("--chunk goes with TABLE or --resume ID")
    if max_rate is not None and (detach or (table_name is None and resume is None)):
        raise click.UsageError("--max-rate paces the chunks this process runs: give it with TABLE (not --detach) "
                               "or with --resume ID")  # fmt: skip
    url = require_url(database_url)
    show = not (quiet or as_json)

    run_rate: float | None = None  # rows/s of the chunks this process ran

    async def go() -> backfills.Progress | list[backfills.Progress]:
        nonlocal run_rate
        async with pgferry.connect(url, pool_size=2) as ferry:
            async with ferry.pool.acquire() as conn:
                if list_:
                    return await backfills.listing(conn)
                if pause is not None or cancel is not None:
                    action, target = ("pause", pause) if pause is not None else ("cancel", cancel)
                    assert target is not None
                    await backfills.set_state(conn, target, action, on_wait=_waiting(target))
                    return await backfills.progress(conn, target)
                if resume is not None:
                    await backfills.set_state(conn, resume, "resume", on_wait=_waiting(resume), chunk_size=chunk)
                    started = resume
                else:
                    assert table_name is not None
                    started = await backfills.start(
                        conn, table_name, subscription=subscription, consumer=consumer,
                        condition=condition, chunk_size=chunk,
                    )  # fmt: skip
                    if detach:
                        return await backfills.progress(conn, started)
                before = (await backfills.progress(conn, started)).rows_done
            began = time.monotonic()
            done = await drive(ferry, started, show, max_rate, console=console)
            run_rate = (done.rows_done - before) / max(time.monotonic() - began, 1e-3)
            return done

    result = run_coroutine(go(), url=url)
    if isinstance(result, list):
        if as_json:
            print_json([p.as_dict() for p in result])
        else:
            table("backfills", backfill_rows(result), BACKFILL_COLUMNS)
        return
    _report(result, as_json, run_rate)
    driven = resume is not None or (table_name is not None and not detach)
    if driven and result.state in ("paused", "cancelled"):
        raise click.exceptions.Exit(EXIT_UNFINISHED)


def _waiting(backfill: int) -> Callable[[], None]:
    """What a pause, resume or cancel says once it has waited a while for a chunk in progress."""
    return lambda: click.echo(
        f"backfill {backfill}: a chunk in progress holds it (it waits for a lock, or is slow); waiting for that "
        "chunk to end (Ctrl-C gives up; a second Ctrl-C where it runs stops it at once)",
        err=True,
    )
