"""`pgferry bench webhooks` still runs end to end (its numbers are in docs/benchmarks.md, not asserted here)."""

from __future__ import annotations

from pgferry.embedded import EmbeddedPostgres
from tests.helpers import cli


async def test_webhooks_bench_delivers_every_scenario_it_runs(pg: EmbeddedPostgres, pgferry_cmd: list[str]) -> None:
    scenarios = ["--only", "1", "--only", "4", "--only", "5"]  # webhooks; failing receiver; pg_net API
    result = await cli(
        pgferry_cmd, pg.url, "bench", "webhooks", "--database-url", pg.url, "--scale", "0.02", *scenarios, timeout=240
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if " 100.00% " in line]
    assert len(rows) == 3, result.stdout
