"""Section 2: how long a committed row takes to reach a stream reader.

pgbench inserts single-row transactions at a fixed rate into a captured
table, each row carrying ``clock_timestamp()``; a real relay (`pgferry run`,
its own process) ticks; a stream reader here notes when each event arrives.
Latency = arrival time minus the row's timestamp (same machine, same clock),
so it includes the commit itself, the wait for the next tick, the tick's
NOTIFY and the reader's two queries.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime

import click

import pgferry
from pgferry import sql as core_sql
from pgferry.aio import wait_for_event
from pgferry.bench.context import BenchContext
from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.relay import running_relay, wait_for_lock
from pgferry.bench.report import Latency, ms, num, pct, table
from pgferry.bench.sqlfiles import pgbench_script, query
from pgferry.schema import CONSUMER_LOCK_CLASS

CONSUMER = "bench-e2e"
STREAM = "bench.e2e"
P50_GOAL_MS = 15.0
P99_GOAL_MS = 100.0
DRAIN_TIMEOUT_S = 30.0
#: events slower than this are listed individually
SLOW_MS = 1000.0


@dataclass
class Arrivals:
    """Per-event latencies as the reader saw them; duplicates counted, not measured twice."""

    seen: set[int] = field(default_factory=set)
    latencies_ms: list[float] = field(default_factory=list)
    #: (latency ms, row id, arrival time) of the slowest events, for diagnosis
    slowest: list[tuple[float, int, float]] = field(default_factory=list)
    duplicates: int = 0
    batches: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, batch: pgferry.Batch) -> None:
        now = time.time()
        self.batches += 1
        for event in batch.events:
            row = event.payload["record"]
            if row["id"] in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(row["id"])
            sent = datetime.fromisoformat(row["sent_at"]).timestamp()
            latency = (now - sent) * 1000.0
            self.latencies_ms.append(latency)
            if latency > SLOW_MS:
                self.slowest.append((latency, row["id"], now))
        self.changed.set()


async def _read(ferry: pgferry.Ferry, arrivals: Arrivals) -> None:
    async for batch in ferry.read(CONSUMER, [STREAM]):
        arrivals.record(batch)
        await batch.ack()


async def run_e2e(ctx: BenchContext) -> None:
    s = ctx.settings
    async with ctx.connect() as conn:
        await conn.execute(query("truncate_e2e"))
        await ctx.checkpoint(conn)
        async with (
            running_relay(ctx.url, max_seconds=s.e2e_seconds + DRAIN_TIMEOUT_S + 60),
            pgferry.connect(ctx.url, pool_size=1) as ferry,
        ):
            # Registered before the first insert, so every row is this consumer's to read.
            await ferry.register_consumer(CONSUMER, [STREAM], start_at="now")
            arrivals = Arrivals()
            reader = asyncio.create_task(_read(ferry, arrivals))
            try:
                lock_key = await conn.fetchval(core_sql.query("consumer_lock_key"), CONSUMER)
                await wait_for_lock(conn, lock_key, "the stream reader", classid=CONSUMER_LOCK_CLASS)
                first_tick = await conn.fetchval(query("last_tick_id"))
                ctx.progress(f"[e2e] {s.rate:,.0f} inserts/s for {s.e2e_seconds:g} s, relay and reader running ...")
                run = await run_pgbench(
                    ctx.url,
                    pgbench_script("e2e"),
                    clients=s.e2e_clients,
                    seconds=s.e2e_seconds,
                    rate=s.rate,
                )
                inserted = int(await conn.fetchval(query("count_e2e")))
                deadline = time.monotonic() + DRAIN_TIMEOUT_S
                while len(arrivals.seen) < inserted and time.monotonic() < deadline and not reader.done():
                    arrivals.changed.clear()
                    await wait_for_event(arrivals.changed, 0.2)
                ticks = int(await conn.fetchval(query("last_tick_id"))) - int(first_tick)
            finally:
                reader.cancel()
                (outcome,) = await asyncio.gather(reader, return_exceptions=True)
            if isinstance(outcome, Exception):
                raise outcome
        await conn.execute(query("truncate_e2e"))

    lat = Latency.of(arrivals.latencies_ms)
    received = len(arrivals.seen)
    delivered = 100.0 * received / inserted if inserted else float("nan")
    achieved = run.tps
    click.echo(
        f"\n2. End-to-end latency, commit -> stream reader: pgbench -R {s.rate:g} -c {s.e2e_clients} single-row "
        f"inserts for {s.e2e_seconds:g} s into a captured table; `pgferry run` relay; one reader"
    )
    click.echo(
        table(
            [
                "target rate",
                "achieved/s",
                "inserted",
                "received",
                "delivered",
                "dupes",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "ticks",
                "events/batch",
            ],
            [
                [
                    num(s.rate),
                    num(achieved),
                    num(inserted),
                    num(received),
                    pct(delivered),
                    num(arrivals.duplicates),
                    ms(lat.p50),
                    ms(lat.p90),
                    ms(lat.p99),
                    ms(lat.max),
                    num(ticks),
                    num(received / arrivals.batches if arrivals.batches else None, 1),
                ]
            ],
        )
    )
    ins = run.latency
    if arrivals.slowest:
        last_id = max(arrivals.seen)
        worst = sorted(arrivals.slowest, reverse=True)[:5]
        click.echo(
            f"   {len(arrivals.slowest)} event(s) took over {SLOW_MS / 1000:g} s; slowest (row id, of last {last_id}): "
            + ", ".join(f"{row_id} {lat / 1000:.1f} s" for lat, row_id, _ in worst)
        )
    click.echo(
        f"   insert transaction latency seen by pgbench (incl. schedule lag): p50 {ms(ins.p50)} ms, "
        f"p99 {ms(ins.p99)} ms, ok {pct(run.success_rate)}"
    )
    ctx.target("e2e", "events received / rows inserted", "100%", pct(delivered), received == inserted > 0)
    ctx.target("e2e", "achieved insert rate", f">= {s.rate * 0.98:,.0f}/s", num(achieved), achieved >= s.rate * 0.98)
    ctx.target("e2e", "latency p50", f"<= {P50_GOAL_MS:g} ms", f"{ms(lat.p50)} ms", lat.p50 <= P50_GOAL_MS)
    ctx.target("e2e", "latency p99", f"<= {P99_GOAL_MS:g} ms", f"{ms(lat.p99)} ms", lat.p99 <= P99_GOAL_MS)
    ctx.results["e2e"] = {
        "rate": s.rate,
        "achieved": achieved,
        "inserted": inserted,
        "received": received,
        "duplicates": arrivals.duplicates,
        "latency_ms": vars(lat),
        "ticks": ticks,
        "batches": arrivals.batches,
        "insert_latency_ms": vars(ins),
        "slow_events": [{"latency_ms": lat, "id": row_id, "arrived": at} for lat, row_id, at in arrivals.slowest],
    }
