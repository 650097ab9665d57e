"""`pgferry bench streams`: the chosen scenarios, then the targets."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import click
import orjson

from pgferry import db
from pgferry.bench import procstat
from pgferry.bench.report import table
from pgferry.bench.sqlfiles import query
from pgferry.bench.streams.catchup import run_catchup
from pgferry.bench.streams.common import Bench, StreamsSettings, connect, progress, q, writer_role
from pgferry.bench.streams.fanout import run_fanout, run_publish
from pgferry.bench.streams.storm import run_storm

# -- the run -------------------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Bench, StreamsSettings], Any]] = {
    "fanout": run_fanout,
    "publish": run_publish,
    "catchup": run_catchup,
    "storm": run_storm,
}


async def run_streams_bench(settings: StreamsSettings, url: str, admin_url: str, json_out: Path | None) -> bool:
    """Run the chosen scenarios; print their tables and the targets; whether every target was met."""
    started, load = datetime.now(UTC), os.getloadavg()
    admin = await db.connect(admin_url)
    try:
        statements = bool(await admin.fetchval(query("has_pg_stat_statements")))
        async with connect(url) as conn:
            info = dict(await conn.fetchrow(query("server_info")))
            # The server's processes, for their CPU: the postmaster is a backend's parent (None: not on this machine).
            postmaster = procstat.parent(int(await conn.fetchval(q("backend_pid"))))
        bench = Bench(url, admin, postmaster, statements, url, admin_url=admin_url)
        bench.writer_url, bench.writer_role = await writer_role(admin, url)
        click.echo(
            f"pgferry bench streams: PostgreSQL {info['version']} (fsync={info['fsync']}, synchronous_commit="
            f"{info['synchronous_commit']}), {os.cpu_count()} CPUs, one relay; server, relay, clients and writers "
            f"share the machine; {started:%Y-%m-%d %H:%M} UTC, load average {load[0]:.2f}"
        )
        if not statements:
            progress("note: pg_stat_statements is not loaded: relay queries/s from transaction counts instead")
        try:
            for scenario in settings.scenarios:
                if scenario == "dbos":
                    from pgferry.bench.streams.versus_dbos import run_dbos

                    assert settings.dbos_python is not None
                    await run_dbos(bench, settings.dbos_python, settings.seconds)
                else:
                    await RUNNERS[scenario](bench, settings)
        finally:
            if bench.writer_role is not None:
                with contextlib.suppress(asyncpg.PostgresError):
                    await admin.execute(q("drop_writer_role"))
    finally:
        await admin.close()
    end_load = os.getloadavg()
    click.echo(f"\nTargets (load average {load[0]:.2f} before, {end_load[0]:.2f} after)")
    click.echo(
        table(
            ["scenario", "what", "goal", "measured", "result"],
            [[t.section, t.what, t.goal, t.measured, "met" if t.met else "MISSED"] for t in bench.targets],
        )
    )
    if json_out is not None:
        await asyncio.to_thread(
            json_out.write_bytes,
            orjson.dumps(
                {
                    "started": started.isoformat(),
                    "settings": str(settings),
                    "results": bench.results,
                    "targets": [vars(t) for t in bench.targets],
                },
                option=orjson.OPT_INDENT_2,
            ),
        )
    return all(t.met for t in bench.targets)
