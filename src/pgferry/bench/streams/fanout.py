"""1. Fan-out (pgbench writing) and 2. publish() while the clients read (Ferry.publish writing)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.producers import SINGLE
from pgferry.bench.report import Latency, ms, num, table
from pgferry.bench.sqlfiles import pgbench_script
from pgferry.bench.streams.common import (
    LATENCY_P50_MS,
    LATENCY_P99_MS,
    PUBLISH_GOAL,
    QPS_GROWTH_LIMIT,
    WARM_UP_S,
    WRITER_CONNECTIONS,
    Bench,
    StreamsSettings,
    Window,
    api_relay,
    clients,
    close_streams,
    latency_of,
    loss,
    progress,
    published,
    read_result,
)

# -- 1. fan-out ----------------------------------------------------------------------------------------


@dataclass
class FanoutRow:
    clients: int
    admitted: int
    committed: int
    received: int
    lost: int
    duplicates: int
    ended: int
    rate: float
    latency: Latency  # after the first WARM_UP_S of the load
    cold: Latency  # the first WARM_UP_S
    window: Window
    writer_p99_ms: float


async def fanout(
    bench: Bench, settings: StreamsSettings, n: int, *, python_writer: bool = False, grouped: bool = True
) -> FanoutRow:
    """``n`` clients on ``n`` streams; ``settings.rate`` events/s across them by pgbench (or, for the
    publish scenario, ``Ferry.publish`` as fast as it goes, ``grouped`` or not) for ``settings.seconds``."""
    prefix = f"{'fan' if not python_writer else 'pub' if grouped else 'one'}{n}:"
    streams = [f"{prefix}{i}" for i in range(n)]
    budget = settings.seconds + 300
    async with api_relay(bench.url, budget) as relay, clients(relay.base, "follow", prefix + "{}", n) as reading:
        bench.relay_pid, bench.client_pid = relay.pid, reading.proc.pid
        try:
            admitted = await reading.ready(timeout=120)
            await asyncio.sleep(settings.settle)
            before = await bench.snapshot()
            load_at = time.time()
            if python_writer:
                writer = await _python_writer(bench.writer_url, prefix + "{}", n, settings, grouped)
                sent, writer_p99 = int(writer["published"]), float(writer["call_p99_ms"])
            else:
                script = pgbench_script("streams", prefix=prefix, streams=str(n))
                run = await run_pgbench(
                    bench.writer_url, script, clients=WRITER_CONNECTIONS, seconds=settings.seconds, rate=settings.rate
                )
                sent, writer_p99 = run.transactions, run.latency.p99
            after = await bench.snapshot()
            await close_streams(bench.url, streams)
            result = await reading.result(timeout=60)
        finally:
            bench.relay_pid = bench.client_pid = None
    committed, lost = loss(await published(bench.url, prefix.replace("_", r"\_") + "%"), result["per_stream"])
    window = bench.window(before, after, sent)
    return FanoutRow(
        n,
        int(admitted["admitted"]),
        committed,
        int(result["events"]),
        lost,
        int(result["duplicates"]),
        int(result["ended"]),
        committed / window.seconds,
        latency_of(result, load_at + WARM_UP_S),
        latency_of(result, 0, load_at + WARM_UP_S),
        window,
        writer_p99,
    )


async def _python_writer(url: str, stream: str, count: int, settings: StreamsSettings, grouped: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pgferry-bench-writer-") as tmp:
        out = Path(tmp) / "result.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pgferry.bench.streams.writer", "--url", url, "--stream", stream,
            "--count", str(count), "--tasks", str(settings.publish_tasks), "--seconds", str(settings.seconds),
            "--out", str(out), *([] if grouped else ["--single"]),
        )  # fmt: skip
        await asyncio.wait_for(proc.wait(), settings.seconds + 60)
        result = read_result(out, proc.returncode, "the publishing process")
    if result["errors"]:
        progress(f"warning: publish() failed {result['errors']}")
    return result


def _fanout_table(rows: list[FanoutRow], statements: bool, labels: list[str] | None = None) -> str:
    headers = [
        *(["publish()"] if labels else []),
        "clients",
        "admitted",
        "committed",
        "received",
        "lost",
        "dupes",
        "ended",
        "events/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "first s max",
        "ticks/s",
        "relay q/s",
    ]
    if statements:
        headers += ["ticker", "reads", "other", "relay DB time"]
    headers += ["CPU relay", "clients", "writer", "postgres", *(["call p99 ms"] if labels else [])]
    lines = []
    for i, r in enumerate(rows):
        w = r.window
        line = [
            *([labels[i]] if labels else []),
            num(r.clients),
            num(r.admitted),
            num(r.committed),
            num(r.received),
            num(r.lost),
            num(r.duplicates),
            num(r.ended),
            num(r.rate),
            ms(r.latency.p50),
            ms(r.latency.p90),
            ms(r.latency.p99),
            ms(r.latency.max),
            ms(r.cold.max),
            num(w.ticks / w.seconds),
            num(w.relay_qps, 1),
        ]
        if statements:
            line += [num(w.relay_queries.get(k, 0) / w.seconds, 1) for k in ("ticker", "reads", "other")]
            line.append(f"{w.relay_db_share:.1f}%")
        line += [w.cpu_pct("relay"), w.cpu_pct("clients"), w.cpu_pct("writer"), w.cpu_pct("postgres")]
        if labels:
            line.append(ms(r.writer_p99_ms))
        lines.append(line)
    return table(headers, lines)


async def run_fanout(bench: Bench, settings: StreamsSettings) -> None:
    rows = []
    for n in settings.clients:
        progress(f"[fanout] {n:,} SSE clients, {settings.rate:,.0f} events/s for {settings.seconds:g} s ...")
        row = await fanout(bench, settings, n)
        progress(
            f"[fanout]   {row.received:,}/{row.committed:,} received, lost {row.lost}, "
            f"p50 {ms(row.latency.p50)} ms, p99 {ms(row.latency.p99)} ms, relay {row.window.relay_qps:.1f} q/s"
        )
        rows.append(row)
    click.echo(
        f"\n1. Fan-out: N SSE clients (one process, raw sockets), each following its own stream from its start; "
        f"pgbench -R {settings.rate:g} -c {WRITER_CONNECTIONS} publishing one event per transaction with "
        f"ferry.publish to a random one of the N streams for {settings.seconds:g} s; a fresh relay per row"
    )
    click.echo(_fanout_table(rows, bench.statements))
    click.echo(
        "   latency: the client's wall clock when the event's bytes arrived minus the payload's t, taken by "
        "clock_timestamp() inside the publishing statement just before its COMMIT (the commit's flush included), "
        f"for the events committed after the load's first {WARM_UP_S:g} s; first s max: the slowest event of that "
        "first second (the ticker, idle until then, looks for commits every 0.5 s until it finds some); "
        "lost: committed (counted in the database, per stream) minus received by that stream's client; dupes: "
        "offsets received again or out of order; ended: clients that got their stream's end event; relay q/s: "
        + (
            "pg_stat_statements calls in the bench database over the load window, less the writer's "
            "ferry.publish (ticker: ferry._tick + housekeeping; reads: the hub's and catch-ups' log reads; "
            "other: delivery's rounds, LISTEN, ...; relay DB time: their execution time per second, 100% = one "
            "backend always busy)"
            if bench.statements
            else "transactions of the bench database over the window less the writer's (pg_stat_statements not loaded)"
        )
        + "; CPU: user + system over the window, 100% = one core (writer: pgbench)"
    )
    if rows[-1].window.statements:
        w = rows[-1].window
        click.echo(f"   the relay's statements at {rows[-1].clients:,} clients, calls/s:")
        for statement, calls in w.statements[:8]:
            click.echo(f"   {calls / w.seconds:8.1f}  {' '.join(statement.split())[:110]}")
    bench.results["fanout"] = [_row_json(r) for r in rows]
    for r in rows:
        bench.target(
            "fanout",
            f"{r.clients:,} clients: every event, once",
            "lost 0, dupes 0, all ended",
            f"lost {r.lost}, dupes {r.duplicates}, ended {r.ended:,}/{r.clients:,}",
            r.lost == 0 and r.duplicates == 0 and r.ended == r.clients and r.committed > 0,
        )
    top = rows[-1]
    bench.target(
        "fanout",
        f"commit-to-client latency, {top.clients:,} clients",
        f"p50 <= {LATENCY_P50_MS:g} ms, p99 <= {LATENCY_P99_MS:g} ms",
        f"p50 {ms(top.latency.p50)} ms, p99 {ms(top.latency.p99)} ms",
        top.latency.p50 <= LATENCY_P50_MS and top.latency.p99 <= LATENCY_P99_MS,
    )
    if len(rows) > 1:
        low, high = rows[0].window.relay_qps, top.window.relay_qps
        growth = high / low if low else float("inf")
        bench.target(
            "fanout",
            "relay queries/s independent of the clients",
            f"{top.clients:,} clients <= {QPS_GROWTH_LIMIT:g}x {rows[0].clients:,}'s",
            f"{low:,.1f} -> {high:,.1f} q/s ({growth:.2f}x)",
            growth <= QPS_GROWTH_LIMIT,
        )


def _row_json(r: FanoutRow) -> dict[str, Any]:
    return {
        "clients": r.clients,
        "committed": r.committed,
        "received": r.received,
        "lost": r.lost,
        "duplicates": r.duplicates,
        "ended": r.ended,
        "rate": r.rate,
        "latency_ms": vars(r.latency),
        "window_s": r.window.seconds,
        "relay_queries": r.window.relay_queries,
        "ticks": r.window.ticks,
        "cpu_s": r.window.cpu,
        "writer_p99_ms": r.writer_p99_ms,
    }


# -- 2. publish() while the clients read -------------------------------------------------------------


async def run_publish(bench: Bench, settings: StreamsSettings) -> None:
    """Ferry.publish as it is (overlapping calls share a transaction) and, side by side, with
    ``group_publishes=False`` (a transaction per call), each on a fresh relay and clients."""
    n = max(settings.clients)
    rows = []
    for grouped in (True, False):
        progress(
            f"[publish] Ferry.publish ({'grouped' if grouped else SINGLE}) from {settings.publish_tasks} tasks for "
            f"{settings.seconds:g} s, {n:,} SSE clients reading ..."
        )
        rows.append(await fanout(bench, settings, n, python_writer=True, grouped=grouped))
    row, single = rows
    click.echo(
        f"\n2. publish() while {n:,} clients read: one process calling Ferry.publish() from {settings.publish_tasks} "
        f"asyncio tasks (pool of {settings.publish_tasks}; one event per call) to the {n:,} streams in turn, as "
        f"fast as they go, for {settings.seconds:g} s; as it is (overlapping calls share a transaction) and with "
        f"{SINGLE} (a transaction per call)"
    )
    click.echo(_fanout_table(rows, bench.statements, ["grouped", SINGLE]))
    click.echo(
        "   events/s: events committed / window; latency: from the payload's t, stamped in Python just before "
        "each publish() call (its round trip and commit included), to its client; call p99: of the publish() "
        "calls alone; CPU writer: the publishing process"
    )
    bench.results["publish"] = _row_json(row)
    bench.results["publish_single"] = _row_json(single)
    bench.target(
        "publish",
        f"publish() while {n:,} clients read",
        f">= {PUBLISH_GOAL:,.0f} events/s",
        f"{row.rate:,.0f} events/s",
        row.rate >= PUBLISH_GOAL,
    )
    bench.target(
        "publish",
        "... every event to its client, once",
        "lost 0, dupes 0",
        f"lost {row.lost + single.lost}, dupes {row.duplicates + single.duplicates}",
        all(r.lost == 0 and r.duplicates == 0 and r.ended == n for r in rows),
    )
