"""`pgferry bench stream-writes`: what durable streams cost the writer, and why the log has no
index on stream (docs/streams.md, "How it scales").

Writes: pgbench publishes, one event per transaction or 100 per ``publish_many``, to random
streams among 100,000, with ``closed`` streams already closed, in three variants run interleaved
(rotating order per round, an empty log and a CHECKPOINT before each cell):

* ``before``: ``ferry.publish`` without what closing streams added (the closed-stream probe and
  the reserved-header check), i.e. the write path before migration 0010;
* ``current``: ``ferry.publish`` / ``ferry.publish_many`` as installed;
* ``+index``: the same with an index on ``ferry.events (stream, txid)``, which history readers
  would use to find a stream's events.

Reads: the log filled with ``log_events`` events across ``log_streams`` streams; how long finding
one stream's events takes with a scan of the whole log (what a reader from the oldest retained
tick would pay without the stream catalog), with the index, and through the catalog's first tick
(``streams.reader.read_range`` from where ``start`` puts a new stream: the last catalogued tick).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import click

from pgferry.bench.context import BenchContext
from pgferry.bench.pgbench import PgbenchRun, run_pgbench
from pgferry.bench.report import ms, num, pct, table
from pgferry.bench.sqlfiles import named, pgbench_script
from pgferry.streams.reader import read_range, start

VARIANTS = ("before", "current", "+index")


@dataclass(frozen=True)
class StreamWriteSettings:
    clients: int = 4
    seconds: float = 10.0
    rounds: int = 3
    #: events per publish_many call in the batch workload
    batch: int = 100
    #: streams closed before the writes start
    closed: int = 100_000
    log_events: int = 1_000_000
    log_streams: int = 100_000


def _q(name: str) -> str:
    return named("stream_writes.sql", name)


async def run_stream_writes(ctx: BenchContext, s: StreamWriteSettings) -> None:
    async with ctx.connect() as conn:
        await conn.execute(_q("setup"))
        await conn.execute(_q("close_many"), s.closed)
    runs: dict[tuple[str, str], list[PgbenchRun]] = defaultdict(list)
    workloads = ("one", "many")
    total = s.rounds * len(workloads) * len(VARIANTS)
    done = 0
    async with ctx.connect() as conn:
        for round_no in range(s.rounds):
            for index, workload in enumerate(workloads):
                shift = (index + round_no) % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    await conn.execute(_q("reset"))
                    if variant == "+index":
                        await conn.execute(_q("add_index"))
                    await ctx.checkpoint(conn)
                    before = variant == "before"
                    if workload == "one":
                        publish = "public.bench_publish_before" if before else "ferry.publish"
                        script = pgbench_script("stream_one", publish=publish)
                    else:
                        publish = "public.bench_publish_many_before" if before else "ferry.publish_many"
                        script = pgbench_script("stream_many", rows=str(s.batch), publish_many=publish)
                    run = await run_pgbench(ctx.url, script, clients=s.clients, seconds=s.seconds)
                    runs[(workload, variant)].append(run)
                    done += 1
                    ctx.progress(f"[stream-writes {done}/{total}] {workload:<4} {variant:<8} {run.tps:>9,.0f} tx/s"
                                 + (f"  ERRORS: {run.errors[0]}" if run.errors else ""))  # fmt: skip
        await conn.execute(_q("reset"))
    _report_writes(ctx, s, runs)
    await _measure_reads(ctx, s)


def _tps(runs: list[PgbenchRun]) -> float:
    return sum(r.tps * r.seconds for r in runs) / sum(r.seconds for r in runs)


def _report_writes(ctx: BenchContext, s: StreamWriteSettings, runs: dict[tuple[str, str], list[PgbenchRun]]) -> None:
    click.echo(
        f"\nWrites: pgbench -M prepared, {s.clients} clients, {s.seconds:g} s per cell x {s.rounds} rounds, "
        f"variants interleaved; {num(s.closed)} streams closed beforehand"
    )
    rows = []
    for workload, events in (("one", 1), ("many", s.batch)):
        base = _tps(runs[(workload, "before")])
        for variant in VARIANTS:
            cell = runs[(workload, variant)]
            tps = _tps(cell)
            spread = [r.tps for r in cell]
            rows.append([
                "publish" if workload == "one" else f"publish_many({s.batch})", variant, num(tps),
                num(tps * events), pct(100 * tps / base),
                f"{min(spread) / base * 100:.0f}-{max(spread) / base * 100:.0f}%",
                ms(cell[0].latency.p99) if len(cell) == 1 else ms(max(r.latency.p99 for r in cell)),
            ])  # fmt: skip
            ctx.results.setdefault("stream_writes", []).append(
                {"workload": workload, "variant": variant, "tps": tps, "events_per_s": tps * events}
            )
    click.echo(table(["write", "variant", "tx/s", "events/s", "vs before", "rounds", "p99 ms (worst)"], rows))


async def _measure_reads(ctx: BenchContext, s: StreamWriteSettings) -> None:
    ctx.progress(f"[stream-writes] filling the log with {num(s.log_events)} events across {num(s.log_streams)} streams")
    async with ctx.connect() as conn:
        chunk = 10_000
        for filled in range(0, s.log_events, chunk):
            await conn.fetchval(_q("fill"), min(chunk, s.log_events - filled), s.log_streams)
        await conn.fetchval("select ferry.tick()")
        await conn.fetchval("select ferry._catalog_streams()")  # the relay's housekeeping, every 5 s
        await conn.execute("analyze ferry.events")
        await conn.fetchval("select ferry.publish('answer:new', '{\"token\": \"hi\"}')")
        await conn.fetchval("select ferry.tick()")
        timings: dict[str, list[float]] = defaultdict(list)
        for _ in range(5):
            started = time.perf_counter()
            await conn.fetchval(_q("scan_stream"), "chat:7")
            timings["scan the retained log"].append(time.perf_counter() - started)
            started = time.perf_counter()
            position = await start(conn, "answer:new", None)
            got = 0
            while position is not None:
                read = await read_range(conn, "answer:new", position, 10_000)
                if read is None:
                    break
                got += len(read[0])
                position = read[1]
            timings["stream catalog (new stream)"].append(time.perf_counter() - started)
            assert got == 1, got
        await conn.execute(_q("add_index"))
        for _ in range(5):
            started = time.perf_counter()
            await conn.fetchval(_q("index_stream"), "chat:7")
            timings["index on (stream, txid)"].append(time.perf_counter() - started)
        await conn.execute(_q("reset"))
    click.echo(
        f"\nReads: finding one stream's events in a log of {num(s.log_events)} events "
        f"({num(s.log_streams)} streams), median of 5"
    )
    rows = [[how, ms(sorted(t)[len(t) // 2] * 1000)] for how, t in timings.items()]
    click.echo(table(["how", "ms"], rows))
    ctx.results["stream_reads_ms"] = {how: sorted(t)[len(t) // 2] * 1000 for how, t in timings.items()}
