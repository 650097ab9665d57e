"""Section 1: what capturing costs the writer.

The same inserts go into four tables that differ only in what fires on
insert: nothing (the ceiling), pgferry's statement-level capture trigger, a
per-row outbox trigger, and a per-row NOTIFY trigger; with ``--filtered``
also a fifth, captured with a condition every row meets and a column list
(so it logs as many events as ``capture``, and the difference is what
evaluating the condition and building the smaller record cost). Variants run
interleaved (rotating order per cell) so slow drift of the machine hurts all
of them alike; every cell starts from empty tables after a CHECKPOINT.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import click

from pgferry.bench.context import BenchContext
from pgferry.bench.pgbench import PgbenchRun, run_pgbench
from pgferry.bench.report import Latency, ms, num, pct, table
from pgferry.bench.sqlfiles import pgbench_script, query

#: variant -> (table, what it stands for)
VARIANTS: dict[str, tuple[str, str]] = {
    "plain": ("bench_plain", "no trigger (ceiling)"),
    "capture": ("bench_capture", "ferry.capture_table (statement trigger)"),
    "outbox": ("bench_outbox", "per-row trigger -> outbox row"),
    "notify": ("bench_notify", "per-row trigger -> pg_notify"),
}

#: --filtered: capture_table(condition => 'amount >= 0', columns => array['id', 'account', 'amount'])
FILTERED: dict[str, tuple[str, str]] = {
    "filtered": ("bench_filtered", "ferry.capture_table with condition + columns"),
}

CAPTURE_VS_OUTBOX_GOAL = 0.90
CAPTURE_VS_NOTIFY_GOAL = 2.0
NOTIFY_GOAL_CLIENTS = 50


@dataclass
class Cell:
    """All runs of one (rows per transaction, clients, variant) cell, merged over rounds."""

    rows: int
    clients: int
    variant: str
    runs: list[PgbenchRun]

    @property
    def tps(self) -> float:
        return sum(r.tps * r.seconds for r in self.runs) / sum(r.seconds for r in self.runs)

    @property
    def rows_per_s(self) -> float:
        return self.tps * self.rows

    @property
    def latency(self) -> Latency:
        return Latency.of([x for r in self.runs for x in r.latencies_ms])

    @property
    def success_rate(self) -> float:
        ok = sum(r.transactions for r in self.runs)
        bad = sum(r.failed + r.aborted_clients for r in self.runs)
        return 100.0 * ok / (ok + bad) if ok + bad else float("nan")


async def run_inserts(ctx: BenchContext) -> None:
    s = ctx.settings
    configs = [(rows, clients) for rows in s.rows for clients in s.clients]
    variants = _variants(ctx)
    names = list(variants)
    runs: dict[tuple[int, int, str], list[PgbenchRun]] = defaultdict(list)
    total = s.rounds * len(configs) * len(names)
    done = 0
    async with ctx.connect() as conn:
        for round_no in range(s.rounds):
            for index, (rows, clients) in enumerate(configs):
                shift = (index + round_no) % len(names)
                for variant in names[shift:] + names[:shift]:
                    await conn.execute(query("truncate_inserts"))
                    await ctx.checkpoint(conn)
                    script = pgbench_script(
                        "insert_one" if rows == 1 else "insert_many", table=variants[variant][0], rows=str(rows)
                    )
                    run = await run_pgbench(ctx.url, script, clients=clients, seconds=s.seconds)
                    runs[(rows, clients, variant)].append(run)
                    done += 1
                    ctx.progress(
                        f"[inserts {done}/{total}] {rows} row(s)/tx, {clients} clients, {variant:<8} "
                        f"{run.tps:>9,.0f} tx/s {run.tps * rows:>10,.0f} rows/s  p99 {ms(run.latency.p99)} ms"
                        + (f"  ERRORS: {run.errors[0]}" if run.errors else "")
                    )
        await conn.execute(query("truncate_inserts"))

    cells = {key: Cell(key[0], key[1], key[2], value) for key, value in runs.items()}
    _report(ctx, cells, configs)


def _variants(ctx: BenchContext) -> dict[str, tuple[str, str]]:
    return VARIANTS | FILTERED if ctx.settings.filtered else VARIANTS


def _report(ctx: BenchContext, cells: dict[tuple[int, int, str], Cell], configs: list[tuple[int, int]]) -> None:
    s = ctx.settings
    variants = _variants(ctx)
    click.echo(
        f"\n1. Insert throughput: pgbench -M prepared -j 2, {s.seconds:g} s per cell x {s.rounds} round(s), "
        "variants interleaved, CHECKPOINT before each cell"
    )
    for variant, (tbl, what) in variants.items():
        click.echo(f"   {variant:<8} {tbl:<14} {what}")
    rows_out = []
    for rows, clients in configs:
        plain = cells[(rows, clients, "plain")]
        for variant in variants:
            c = cells[(rows, clients, variant)]
            lat = c.latency
            rows_out.append([
                str(rows), str(clients), variant, num(c.tps), num(c.rows_per_s),
                ms(lat.p50), ms(lat.p90), ms(lat.p99), ms(lat.max), pct(c.success_rate),
                pct(100.0 * c.rows_per_s / plain.rows_per_s),
            ])  # fmt: skip
    click.echo(
        table(
            [
                "rows/tx",
                "clients",
                "variant",
                "tx/s",
                "rows/s",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "ok",
                "vs plain",
            ],
            rows_out,
        )
    )

    click.echo("\n   Ratios (rows/s)")
    ratio_rows = []
    results = []
    for rows, clients in configs:
        cap = cells[(rows, clients, "capture")].rows_per_s
        outbox = cells[(rows, clients, "outbox")].rows_per_s
        notify = cells[(rows, clients, "notify")].rows_per_s
        vs_outbox = cap / outbox
        vs_notify = cap / notify
        ok_outbox = vs_outbox >= CAPTURE_VS_OUTBOX_GOAL
        ok_notify = vs_notify >= CAPTURE_VS_NOTIFY_GOAL
        checked_notify = clients == NOTIFY_GOAL_CLIENTS
        ratio_rows.append([
            str(rows), str(clients),
            pct(100 * vs_outbox), "met" if ok_outbox else "MISSED",
            f"{vs_notify:.2f}x", ("met" if ok_notify else "MISSED") if checked_notify else "(not a target)",
        ])  # fmt: skip
        where = f"{rows} row(s)/tx, {clients} clients"
        ctx.target("inserts", f"capture vs outbox, {where}", ">= 90%", pct(100 * vs_outbox), ok_outbox)
        if checked_notify:
            ctx.target("inserts", f"capture vs per-row notify, {where}", ">= 2x", f"{vs_notify:.2f}x", ok_notify)
        results.append(
            {"rows": rows, "clients": clients, "capture_vs_outbox": vs_outbox, "capture_vs_notify": vs_notify}
        )
    click.echo(
        table(
            ["rows/tx", "clients", "capture/outbox", "goal >= 90%", "capture/notify", "goal >= 2x @ 50 clients"],
            ratio_rows,
        )
    )
    ctx.results["inserts"] = {
        "cells": [
            {
                "rows": c.rows,
                "clients": c.clients,
                "variant": c.variant,
                "tps": c.tps,
                "rows_per_s": c.rows_per_s,
                "latency_ms": vars(c.latency),
                "success_rate": c.success_rate,
            }
            for c in cells.values()
        ],
        "ratios": results,
    }
