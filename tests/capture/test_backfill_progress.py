"""A backfill's progress where operators look: Progress (rate, ETA), `pgferry status`, Prometheus."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import click
import pytest
from rich.console import Console

from pgferry.capture import backfill as backfills_api
from pgferry.capture.backfill import BackfillSettings, Progress
from pgferry.cli.backfill import _report
from pgferry.cli.common import progress_cell
from pgferry.ops import backfill as backfill_output
from pgferry.ops.metrics import RelayMetrics
from tests.helpers import FAST, RunningRelay, cli, eventually, scrape, series

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _progress(**changes: object) -> Progress:
    base = Progress(
        id=1, table="public.t", target=None, condition=None, chunk_size=10, rows_done=300, rows_estimate=1000,
        state="running", reason=None, started_at=T0, updated_at=T0 + timedelta(seconds=3), finished_at=None,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_rate_and_eta_come_from_rows_done_since_the_start_and_the_estimate() -> None:
    p = _progress()
    assert p.rate == 100.0 and p.eta == timedelta(seconds=7) and p.total == 1000


def test_an_estimate_the_rows_done_passed_is_unknown_until_done_and_unknown_stays_unknown() -> None:
    """A table never analyzed: the planner guessed about half its rows, and progress read 100%, ETA
    0:00:00, with rows to go; a backfill cancelled at 75% read 100% (outside probe)."""
    assert _progress(rows_estimate=200).total is None and _progress(rows_estimate=200).eta is None
    assert _progress(rows_estimate=200, state="cancelled").total is None
    assert _progress(rows_estimate=200, state="done").total == 300  # what it found
    assert _progress(rows_estimate=5000, state="done").total == 300
    assert _progress(rows_estimate=None).eta is None and _progress(rows_estimate=None).total is None
    assert _progress(state="paused").eta is None
    assert _progress(rows_done=0).rate is None


def test_a_running_backfill_without_a_chunk_for_two_minutes_shows_as_orphaned_with_no_eta() -> None:
    assert not _progress(idle_seconds=5.0).orphaned and _progress(idle_seconds=5.0).eta is not None
    # meanwhile its rate falls and its ETA grows (they stood still while its runner was dead)
    assert _progress(idle_seconds=3.0).rate == 50.0 and _progress(idle_seconds=3.0).eta == timedelta(seconds=14)
    assert _progress(idle_seconds=3.0, state="paused").rate == 100.0
    assert _progress(idle_seconds=600.0).orphaned and _progress(idle_seconds=600.0).eta is None
    assert not _progress(idle_seconds=600.0, state="paused").orphaned


def test_the_progress_cell_rounds_down_so_that_only_a_finished_backfill_shows_a_full_bar() -> None:
    assert progress_cell(300, 1000) == "30% ███░░░░░░░"
    assert progress_cell(999, 1000) == "99% █████████░"
    assert progress_cell(400, 1000, finished=True) == "100% ██████████"  # an estimate above the rows found
    assert progress_cell(5, None) == "" and progress_cell(0, 0) == ""


def test_rate_and_eta_gauges_are_left_out_when_not_known() -> None:
    metrics = RelayMetrics()
    metrics.set_backfills([_progress(), _progress(id=2, state="paused"), _progress(id=3, rows_done=0)])

    def sample(name: str, backfill: int, state: str = "running") -> float | None:
        labels = {"backfill": str(backfill), "table": "public.t", "target": "", "state": state}
        return metrics.registry.get_sample_value(name, labels)

    assert (sample("pgferry_backfill_rows_per_second", 1), sample("pgferry_backfill_eta_seconds", 1)) == (100, 7)
    assert sample("pgferry_backfill_rows_per_second", 2, "paused") == 100
    assert sample("pgferry_backfill_eta_seconds", 2, "paused") is None  # paused: no time left to speak of
    assert sample("pgferry_backfill_rows_per_second", 3) is None and sample("pgferry_backfill_eta_seconds", 3) is None
    metrics.set_backfills([])
    assert sample("pgferry_backfill_rows_per_second", 1) is None, "a finished backfill's series vanish"


def test_runner_settings_refuse_nonsense_with_the_reason() -> None:
    for bad, says in (({"backfill": 0}, "backfill id"), ({"backfill": 1, "busy_wait": 0}, "busy_wait"),
                      ({"backfill": 1, "max_rate": 0}, "max_rate")):  # fmt: skip
        try:
            BackfillSettings(**bad)
        except ValueError as exc:
            assert says in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


async def test_status_metrics_and_dashboard_show_a_running_backfill_with_rows_done_and_the_estimate(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 1000)")
    await conn.execute("analyze t")
    await conn.execute("select ferry.capture_table('t')")
    await conn.execute("select ferry.register_consumer('reader')")
    backfill = await conn.fetchval("select ferry.backfill('t', consumer => 'reader', chunk_size => 100)")
    for _ in range(3):
        await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)

    status = await cli(pgferry_cmd, db_url, "status")
    assert status.returncode == 0, status.stderr
    backfills = status.stdout[status.stdout.index("backfills") :]  # after the captured tables
    line = next(ln for ln in backfills.splitlines() if "public.t" in ln)
    assert "reader" in line and "running" in line and "30% ███░░░░░░░  300 / ~1,000" in line

    relay = RunningRelay(db_url, replace(FAST, metrics_port=0, dashboard_port=0, deliver=False))
    try:

        async def serving() -> bool:
            return {"metrics", "dashboard"} <= relay.relay.addresses.keys()

        await eventually(serving, what="the metrics and dashboard servers")
        url = relay.relay.addresses["metrics"]
        samples = await scrape(url)
        done = series(samples, "pgferry_backfill_rows_done")
        estimate = series(samples, "pgferry_backfill_rows_estimate")
        rate = series(samples, "pgferry_backfill_rows_per_second")
        eta = series(samples, "pgferry_backfill_eta_seconds")
        async with aiohttp.ClientSession() as session, session.get(relay.relay.addresses["dashboard"]) as page:
            html = await page.text()
    finally:
        await relay.stop()
    labels = tuple(
        sorted({"backfill": str(backfill), "table": "public.t", "target": "reader", "state": "running"}.items())
    )
    assert done == {labels: 300} and estimate == {labels: 1000}
    # No chunk since: the rate is rows done over its start to now, so it was higher when scraped.
    progress = await backfills_api.progress(conn, backfill)
    assert progress.rate is not None and progress.eta is not None
    assert rate.keys() == {labels} and rate[labels] >= progress.rate
    assert eta.keys() == {labels} and eta[labels] <= progress.eta.total_seconds()
    assert abs(eta[labels] - 700 / rate[labels]) < 1e-6
    assert "<h2>Backfills</h2>" in html and '<progress value="300" max="1000">' in html and "300 / ~1,000" in html


def test_a_failed_backfill_that_no_resume_can_pass_is_not_told_to_resume() -> None:
    """Its target is gone, its key or stream changed: `--resume` would fail the same way (outside probe)."""
    final = _progress(state="failed", reason="public.t is now captured into stream 'x', ...; start a new backfill")
    with pytest.raises(click.ClickException) as failed:
        _report(final, as_json=False)
    assert "--resume" not in failed.value.message and "start a new backfill" in failed.value.message
    with pytest.raises(click.ClickException) as failed:
        _report(_progress(state="failed", reason="permission denied for table t"), as_json=False)
    assert "fix the cause, then `pgferry backfill --resume 1`" in failed.value.message


def test_output_that_is_not_a_terminal_gets_whole_lines_with_the_rate_and_time_left() -> None:
    """`pgferry backfill ... > log`: a line every LINE_EVERY seconds, never cut at the console's width."""
    out = io.StringIO()
    now = [100.0]
    name = "backfill 7 of public.orders_with_a_long_name"
    lines = backfill_output.ProgressLines(Console(file=out, width=40), name, 0, clock=lambda: now[0])
    for seconds, done, estimate in ((1, 20_000, 1_000_000), (9, 250_000, 1_000_000), (10, 260_000, 1_000_000),
                                    (20, 1_000_000, None)):  # fmt: skip
        now[0] = 100.0 + seconds
        lines.update(done, estimate)
    assert out.getvalue().splitlines() == [  # at 10 s and at 20 s (a table never analysed: no estimate)
        f"{name}: 260,000 / ~1,000,000 rows (26%), 26,000 rows/s, about 0:00:28 left",
        f"{name}: 1,000,000 / ? rows, 50,000 rows/s",
    ]
