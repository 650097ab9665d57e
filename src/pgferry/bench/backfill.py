"""`pgferry bench backfill`: how fast a backfill writes READ events, and what it costs live writers.

One table of ``rows`` orders-like rows, captured. Three cells, one after another, each after a
CHECKPOINT:

* ``writers alone``: pgbench, ``clients`` connections of single-row UPDATEs of random rows of the
  table (captured: each commits an UPDATE event), for ``seconds``, once first and once last: a
  shared machine drifts, and the baseline is their mean;
* ``backfill alone``: the whole table backfilled in ``chunk``-row chunks, nothing else running;
* ``side by side``: the same writers and a second backfill of the whole table at once. pgbench
  runs for twice the time the lone backfill took (plus 2 s), and the backfill starts 1 s in, so
  the writers' throughput is counted inside the backfill's window: the UPDATE events whose
  transactions started between the backfill's start and end.

The brief's targets: >= 100,000 rows/s into the log for 1,000,000 rows, while the writers keep
>= 80% of their throughput (docs/backfills.md has the numbers and what they depend on).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import click

from pgferry.bench.context import BenchContext
from pgferry.bench.cores import CoreSplit, pinned
from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.report import num, pct, table
from pgferry.bench.sqlfiles import named, pgbench_script
from pgferry.capture import backfill as backfills

#: The brief's goals for a 1,000,000-row table.
TARGET_ROWS_PER_S = 100_000
TARGET_WRITER_SHARE = 80.0


@dataclass(frozen=True)
class BackfillBenchSettings:
    rows: int = 1_000_000
    chunk: int = backfills.DEFAULT_CHUNK
    clients: int = 4
    seconds: float = 10.0
    #: the backfills' --max-rate (None: as fast as they go)
    max_rate: float | None = None
    #: the writers and the backfill on cores of their own (bench/cores.py; None: not pinned)
    pin: CoreSplit | None = None

    def __post_init__(self) -> None:
        if self.rows < 1 or self.chunk < 1 or self.clients < 1 or self.seconds < 1:
            raise ValueError("rows, chunk and clients must be >= 1, seconds >= 1")


def _q(name: str) -> str:
    return named("backfill.sql", name)


async def _backfill(ctx: BenchContext, chunk: int, max_rate: float | None) -> tuple[int, float, datetime, datetime]:
    """One backfill of the whole table, driven here: rows, seconds, and its window (database clock)."""
    async with ctx.connect() as conn:
        backfill = await backfills.start(conn, "public.bench_orders", chunk_size=chunk)
        began = await conn.fetchval("select clock_timestamp()")
        started = time.perf_counter()
        state = await backfills.BackfillRunner(conn, backfills.BackfillSettings(backfill, max_rate=max_rate)).run(
            asyncio.Event()
        )
        seconds = time.perf_counter() - started
        ended = await conn.fetchval("select clock_timestamp()")
        done = await backfills.progress(conn, backfill)
    if state != "done":
        raise click.ClickException(f"bench backfill {backfill} ended {state}: {done.reason}")
    return done.rows_done, seconds, began, ended


async def run_backfill_bench(ctx: BenchContext, s: BackfillBenchSettings) -> None:
    async with pinned(s.pin, ctx.url):
        await _run(ctx, s)


async def _run(ctx: BenchContext, s: BackfillBenchSettings) -> None:
    ctx.progress(f"filling bench_orders with {s.rows:,} rows ...")
    async with ctx.connect() as conn:
        await conn.execute(_q("setup"))
        await conn.execute(_q("fill"), s.rows)
        await conn.execute(_q("capture"))
        await conn.execute(_q("analyze"))
        await conn.execute(_q("register"))
    script = pgbench_script("backfill_writer", rows=str(s.rows))

    ctx.progress(f"writers alone: {s.clients} pgbench clients, {s.seconds:.0f} s ...")
    async with ctx.connect() as conn:
        await ctx.checkpoint(conn)
    alone = await run_pgbench(ctx.url, script, clients=s.clients, seconds=s.seconds)

    ctx.progress("backfill alone ...")
    async with ctx.connect() as conn:
        await ctx.checkpoint(conn)
    rows_alone, secs_alone, _, _ = await _backfill(ctx, s.chunk, s.max_rate)

    side_seconds = 2 * secs_alone + 2
    ctx.progress(f"side by side: pgbench for {side_seconds:.0f} s, a backfill from 1 s in ...")
    async with ctx.connect() as conn:
        await ctx.checkpoint(conn)
    writers = asyncio.create_task(run_pgbench(ctx.url, script, clients=s.clients, seconds=side_seconds))
    await asyncio.sleep(1.0)
    rows_side, secs_side, began, ended = await _backfill(ctx, s.chunk, s.max_rate)
    side = await writers
    ctx.progress(f"writers alone again: {s.seconds:.0f} s ...")
    async with ctx.connect() as conn:
        await ctx.checkpoint(conn)
    again = await run_pgbench(ctx.url, script, clients=s.clients, seconds=s.seconds)
    baseline = (alone.tps + again.tps) / 2
    async with ctx.connect() as conn:
        in_window = int(await conn.fetchval(_q("writes_between"), began, ended))
        reads = int(await conn.fetchval(_q("read_events")))
    window = (ended - began).total_seconds()
    writer_side = in_window / window if window > 0 else 0.0
    share = 100.0 * writer_side / baseline if baseline else float("nan")
    rate_alone, rate_side = rows_alone / secs_alone, rows_side / secs_side

    click.echo(
        f"\nBackfill of {s.rows:,} rows ({s.chunk:,} a chunk"
        f"{f', at most {s.max_rate:,.0f} rows/s' if s.max_rate else ''}) and {s.clients} single-row UPDATE writers "
        f"(pgbench) on the same table, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        f"{f'; pinned: {s.pin}' if s.pin else ''}"
    )
    click.echo(
        table(
            ["cell", "backfill rows/s", "backfill s", "writer tx/s", "writers vs baseline", "writer failures"],
            [
                [
                    "writers alone, first",
                    "-",
                    "-",
                    num(alone.tps),
                    pct(100.0 * alone.tps / baseline),
                    num(alone.failed),
                ],
                ["backfill alone", num(rate_alone), f"{secs_alone:.1f}", "-", "-", "-"],
                ["side by side", num(rate_side), f"{secs_side:.1f}", num(writer_side), pct(share), num(side.failed)],
                ["writers alone, last", "-", "-", num(again.tps), pct(100.0 * again.tps / baseline), num(again.failed)],
            ],
        )
    )
    click.echo(
        f"side by side: writers counted over the backfill's {window:.1f} s window ({in_window:,} UPDATE events); "
        f"whole pgbench run {num(side.tps)} tx/s. READ events in the log: {reads:,} "
        f"(expected {rows_alone + rows_side:,})"
    )
    ok_rows = rate_side >= TARGET_ROWS_PER_S
    ok_writers = share >= TARGET_WRITER_SHARE
    ctx.target("backfill", "rows/s into the log, writers running", f">= {TARGET_ROWS_PER_S:,}", num(rate_side), ok_rows)
    ctx.target("backfill", "writers' throughput kept", f">= {TARGET_WRITER_SHARE:.0f}%", pct(share), ok_writers)
    ctx.target("backfill", "every row one READ event", f"{rows_alone + rows_side:,}", num(reads),
               reads == rows_alone + rows_side)  # fmt: skip
    ctx.results["backfill"] = {
        "writers_alone_tps": [alone.tps, again.tps], "backfill_alone_rows_per_s": rate_alone,
        "backfill_side_rows_per_s": rate_side,
        "writers_side_tps": writer_side, "writers_share_pct": share, "window_s": window,
    }  # fmt: skip
