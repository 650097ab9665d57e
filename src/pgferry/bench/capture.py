"""`pgferry bench capture`: every section, in one run, against one server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import click

from pgferry.bench.context import BenchContext, BenchSettings, scratch_database
from pgferry.bench.cores import pinned
from pgferry.bench.e2e import run_e2e
from pgferry.bench.idle import run_idle
from pgferry.bench.inserts import run_inserts
from pgferry.bench.producers import run_producers
from pgferry.bench.report import table
from pgferry.bench.wal import run_wal

RUNNERS: dict[str, Callable[[BenchContext], Awaitable[None]]] = {
    "inserts": run_inserts,
    "e2e": run_e2e,
    "producers": run_producers,
    "idle": run_idle,
    "wal": run_wal,
}


def _load(avg: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in avg) + " (1, 5, 15 min)"


async def run_capture_bench(settings: BenchSettings, admin_url: str, json_out: Path | None) -> bool:
    """Run the chosen sections; print their tables and the targets; return whether every target was met."""
    started = time.monotonic()
    load_before = os.getloadavg()
    async with scratch_database(settings, admin_url) as ctx:
        srv = ctx.server
        click.echo(
            f"pgferry bench capture: PostgreSQL {srv['version']} (fsync={srv['fsync']}, "
            f"synchronous_commit={srv['synchronous_commit']}, wal_sync_method={srv['wal_sync_method']}, "
            f"shared_buffers={srv['shared_buffers']}), {srv['cpus']} CPUs, Python {srv['python']}; "
            f"server, load generator and pgferry share the machine"
        )
        # Anything else running skews every number: say how busy the machine was.
        click.echo(f"load average before: {_load(load_before)}")
        if settings.pin is not None:
            click.echo(f"pinned (--pin): {settings.pin}, in every cell")
        async with pinned(settings.pin, ctx.url):
            for section in settings.sections:
                await RUNNERS[section](ctx)

    ctx.server["load_before"] = _load(load_before)
    ctx.server["load_after"] = _load(os.getloadavg())
    click.echo(f"\nTargets ({time.monotonic() - started:.0f} s in all; load average after: {ctx.server['load_after']})")
    click.echo(
        table(
            ["section", "what", "goal", "measured", "result"],
            [[t.section, t.what, t.goal, t.measured, "met" if t.met else "MISSED"] for t in ctx.targets],
        )
    )
    if json_out is not None:
        await asyncio.to_thread(
            json_out.write_text,
            json.dumps(
                {
                    "server": ctx.server,
                    "settings": vars(settings),
                    "results": ctx.results,
                    "targets": [vars(t) for t in ctx.targets],
                },
                indent=2,
                default=str,
            ),
        )
    return all(t.met for t in ctx.targets)
