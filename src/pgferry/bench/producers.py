"""Section 3: how fast Python code can append events through the public API.

``Ferry.publish()`` from many asyncio tasks, as it is (overlapping calls share
a transaction) and with ``group_publishes=False`` (each call its own committed
transaction, so the server's group commit is what keeps up), and
``publish_many()`` with big batches per call and transaction. Runs on uvloop
in this process, against the same server as everything else.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import click

import pgferry
from pgferry.bench.context import BenchContext
from pgferry.bench.report import Latency, ms, num, table
from pgferry.bench.sqlfiles import query

STREAM = "bench.publish"
PUBLISH_GOAL = 5000.0
#: how the benches label publish() with a transaction per call
SINGLE = "group_publishes=False"
#: (label, events per call, concurrent tasks (0 = the --publish-tasks setting), group_publishes)
CASES: tuple[tuple[str, int, int, bool], ...] = (
    ("publish()", 1, 0, True),
    (f"publish() {SINGLE}", 1, 0, False),
    ("publish_many()", 100, 4, True),
    ("publish_many()", 1000, 4, True),
)


@dataclass
class ProducerResult:
    label: str
    per_call: int
    tasks: int
    seconds: float
    events: int
    calls: int
    latency: Latency

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds


def _payload(n: int) -> dict[str, Any]:
    return {"order_id": n, "account": n % 1000, "amount": "12.50", "note": "pgferry bench event"}


async def _warm(ferry: pgferry.Ferry, tasks: int) -> None:
    """Open every pool connection before the clock starts; connecting is not publishing."""
    held = [await ferry.pool.acquire() for _ in range(tasks)]
    for conn in held:
        await ferry.pool.release(conn)


async def _measure(ctx: BenchContext, label: str, per_call: int, tasks: int, grouped: bool) -> ProducerResult:
    seconds = ctx.settings.seconds
    latencies: list[float] = []
    counts = [0] * tasks
    async with pgferry.connect(ctx.url, pool_size=tasks, group_publishes=grouped) as ferry:
        await _warm(ferry, tasks)
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            n = index * 1_000_000_000
            batch = [{"stream": STREAM, "payload": _payload(n + i), "key": str(n + i)} for i in range(per_call)]
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                if per_call == 1:
                    await ferry.publish(STREAM, _payload(n), key=str(n))
                else:
                    await ferry.publish_many(batch)
                latencies.append((time.perf_counter() - started) * 1000.0)
                counts[index] += 1
                n += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(tasks)))
        elapsed = time.perf_counter() - started
    calls = sum(counts)
    return ProducerResult(label, per_call, tasks, elapsed, calls * per_call, calls, Latency.of(latencies))


async def run_producers(ctx: BenchContext) -> None:
    results = []
    async with ctx.connect() as conn:
        for label, per_call, case_tasks, grouped in CASES:
            tasks = case_tasks or ctx.settings.publish_tasks
            await conn.execute(query("truncate_events"))
            await ctx.checkpoint(conn)
            result = await _measure(ctx, label, per_call, tasks, grouped)
            stored = int(await conn.fetchval(query("count_events")))
            if stored != result.events:
                raise RuntimeError(f"{label}: {result.events} events published but {stored} stored")
            results.append(result)
            ctx.progress(
                f"[producers] {label} x{per_call}, {tasks} tasks: {result.events_per_s:,.0f} events/s "
                f"({result.calls_per_s:,.0f} calls/s)"
            )
        await conn.execute(query("truncate_events"))

    click.echo(
        f"\n3. Python producers (asyncpg pool, uvloop, {ctx.settings.seconds:g} s each; "
        f"each call its own committed transaction, but publish() without {SINGLE}: overlapping calls share one)"
    )
    click.echo(
        table(
            ["call", "events/call", "tasks", "events/s", "calls/s", "p50 ms", "p90 ms", "p99 ms", "max ms"],
            [
                [
                    r.label,
                    num(r.per_call),
                    num(r.tasks),
                    num(r.events_per_s),
                    num(r.calls_per_s),
                    ms(r.latency.p50),
                    ms(r.latency.p90),
                    ms(r.latency.p99),
                    ms(r.latency.max),
                ]
                for r in results
            ],
        )
    )
    single = results[0]
    ctx.target(
        "producers",
        f"publish() events/s, {single.tasks} tasks",
        f">= {PUBLISH_GOAL:,.0f}/s",
        num(single.events_per_s),
        single.events_per_s >= PUBLISH_GOAL,
    )
    alone, best_many = results[1], max(results[2:], key=lambda r: r.events_per_s)
    ctx.target(
        "producers",
        f"publish_many() events/s vs publish() {SINGLE}",
        "far higher (>= 5x)",
        f"{best_many.events_per_s / alone.events_per_s:.1f}x",
        best_many.events_per_s >= 5 * alone.events_per_s,
    )
    ctx.results["producers"] = [
        {
            **{k: v for k, v in vars(r).items() if k != "latency"},
            "latency_ms": vars(r.latency),
            "events_per_s": r.events_per_s,
        }
        for r in results
    ]
