"""`pgferry bench filter`: what a subscription filter costs the relay's read.

A subscription's filter (migration 0012) is evaluated where the relay reads
a batch (ferry.webhook_steps), once per event of the subscription's streams.
This fills the log with captured rows (the Supabase envelope the filter
sees), in ticks of TICK_ROWS rows, then walks the whole range with the very
read a webhook worker makes, once per variant: no filter, filters that
match every, a tenth and no event, one over $key and one with a regular
expression. The walks are repeated, variants interleaved, and the fastest
of each is kept; the table gives the time per event read from the log.

Nothing is sent: the walk peeks and never acknowledges, so every variant
reads the same batches. The read's round trips are included (as for the
relay); with 5,000-event batches they are a small share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg
import click

from pgferry.bench.context import BenchContext
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import named

#: Rows per tick while filling: batches then span several ticks, as under load.
TICK_ROWS = 1000

#: (name, filter) per variant, the first without a filter (the baseline).
VARIANTS: tuple[tuple[str, str | None], ...] = (
    ("no filter", None),
    ("matches all", "$.record.amount >= 0"),
    ("matches 1 in 10", "$.record.amount < 100"),
    ("matches none", '$.type == "DELETE"'),
    ("$key, 1 in 10", '$key starts with "1"'),
    ("regex, 1 in 100", '$.record.note like_regex "^note [0-9]*00$" && $.record.account == 0'),
)


@dataclass
class FilterResult:
    name: str
    filter: str | None
    log_events: int
    returned: int
    seconds: float


def _q(name: str) -> str:
    return named("filter.sql", name)


async def _walk(conn: asyncpg.Connection, subscription: str) -> tuple[int, float]:
    """Read every batch after the subscription's cursor, as a worker does; (events returned, seconds)."""
    returned = 0
    after: int | None = None
    started = time.perf_counter()
    while True:
        rows = await conn.fetch(_q("read"), subscription, after)
        if not rows:
            return returned, time.perf_counter() - started
        returned += sum(1 for r in rows if r["id"] is not None)
        after = rows[0]["end_tick"]
        if not rows[0]["more"]:
            return returned, time.perf_counter() - started


async def run_filter_bench(ctx: BenchContext, rows: int, rounds: int) -> list[FilterResult]:
    async with ctx.connect() as conn:
        for number, (_, text) in enumerate(VARIANTS):
            await conn.execute(_q("subscribe"), f"filter-{number}", text)
        ctx.progress(f"filling the log with {rows:,} captured rows ...")
        for start in range(0, rows, TICK_ROWS):
            await conn.execute(_q("fill"), min(TICK_ROWS, rows - start))
            await conn.fetchval(_q("tick"))
        log_events = int(await conn.fetchval(_q("log_events")))
        await conn.execute(_q("analyze"))
        await ctx.checkpoint(conn)
        await _walk(conn, "filter-0")  # warm-up: caches and the read's plan, not scored
        best = [float("inf")] * len(VARIANTS)
        returned = [0] * len(VARIANTS)
        for _ in range(rounds):  # variants interleaved, so that a noisy moment does not hit one variant only
            for number in range(len(VARIANTS)):
                returned[number], seconds = await _walk(conn, f"filter-{number}")
                best[number] = min(best[number], seconds)
        results = []
        for number, (name, text) in enumerate(VARIANTS):
            ctx.progress(f"{name}: {returned[number]:,} of {log_events:,} events in {best[number]:.3f} s")
            results.append(FilterResult(name, text, log_events, returned[number], best[number]))
        return results


def print_table(results: list[FilterResult]) -> None:
    base = results[0].seconds / results[0].log_events
    rows = []
    for r in results:
        per_event = r.seconds / r.log_events
        rows.append([
            r.name, r.filter or "-", num(r.log_events), num(r.returned), num(r.log_events / r.seconds),
            num(per_event * 1e6, 2), num((per_event - base) * 1e6, 2),
        ])  # fmt: skip
    headers = ["variant", "filter", "log events", "returned", "read events/s", "µs per event",
               "µs more than no filter"]  # fmt: skip
    click.echo(table(headers, rows))
