"""Section 4: what pgferry costs an idle database.

With the relay running and one stream reader waiting and nothing written,
count the transactions the bench database runs (pg_stat_database, read from
another database so the reading itself is not counted). Every pgferry query
is one autocommit transaction, so transactions/s is queries/s.

PostgreSQL backends report their counters at most once a second, so the
figure is good to about one second's worth of queries over the window.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import click

import pgferry
from pgferry import db
from pgferry import sql as core_sql
from pgferry.bench.context import BENCH_DATABASE, BenchContext
from pgferry.bench.relay import running_relay, wait_for_lock
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import query
from pgferry.schema import CONSUMER_LOCK_CLASS

CONSUMER = "bench-idle"
SETTLE_S = 4.0
QPS_GOAL = 5.0
#: backends publish their transaction counts at most once a second
STATS_FLUSH_S = 1.5


async def _read(ferry: pgferry.Ferry, received: list[int]) -> None:
    async for batch in ferry.read(CONSUMER):
        received.append(len(batch))
        await batch.ack()


async def _calls(admin: asyncpg.Connection) -> dict[str, int]:
    return {r["query"]: int(r["calls"]) for r in await admin.fetch(query("statement_calls"), BENCH_DATABASE)}


async def run_idle(ctx: BenchContext) -> None:
    seconds = ctx.settings.idle_seconds
    received: list[int] = []
    admin = await db.connect(ctx.admin_url)
    try:
        async with ctx.connect() as conn:
            # Leave autovacuum nothing to do during the window.
            await conn.execute(query("vacuum_analyze"))
            await ctx.checkpoint(conn)
            async with (
                running_relay(ctx.url, max_seconds=seconds + SETTLE_S + 60),
                pgferry.connect(ctx.url, pool_size=1) as ferry,
            ):
                reader = asyncio.create_task(_read(ferry, received))
                try:
                    lock_key = await conn.fetchval(core_sql.query("consumer_lock_key"), CONSUMER)
                    await wait_for_lock(conn, lock_key, "the stream reader", classid=CONSUMER_LOCK_CLASS)
                    ctx.progress(f"[idle] relay and one reader idle for {seconds:g} s (after {SETTLE_S:g} s to settle)")
                    await asyncio.sleep(SETTLE_S)
                    first_tick = int(await conn.fetchval(query("last_tick_id")))
                    await asyncio.sleep(STATS_FLUSH_S)  # let that query's count land before the window
                    breakdown = bool(await admin.fetchval(query("has_pg_stat_statements")))
                    started = time.monotonic()
                    before = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE))
                    calls_before = await _calls(admin) if breakdown else {}
                    await asyncio.sleep(seconds)
                    after = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE))
                    calls_after = await _calls(admin) if breakdown else {}
                    elapsed = time.monotonic() - started
                    ticks = int(await conn.fetchval(query("last_tick_id"))) - first_tick
                finally:
                    reader.cancel()
                    (outcome,) = await asyncio.gather(reader, return_exceptions=True)
                if isinstance(outcome, Exception):
                    raise outcome
    finally:
        await admin.close()

    queries = after - before
    qps = queries / elapsed
    click.echo(f"\n4. Idle cost: relay + one waiting stream reader, no writes, {elapsed:.1f} s")
    click.echo(
        table(
            ["queries", "per second", "ticks taken", "batches read"],
            [[num(queries), num(qps, 2), num(ticks), num(len(received))]],
        )
    )
    click.echo("   (pg_stat_database transaction counters; backends report them about once a second)")
    per_statement = {
        q: calls_after[q] - calls_before.get(q, 0) for q in calls_after if calls_after[q] > calls_before.get(q, 0)
    }
    if per_statement:
        click.echo("   by statement (pg_stat_statements):")
        click.echo(
            table(
                ["calls/s", "statement"],
                [
                    [num(n / elapsed, 2), " ".join(q.split())[:90]]
                    for q, n in sorted(per_statement.items(), key=lambda item: -item[1])
                ],
            )
        )
    ctx.target("idle", "queries/s while idle", f"<= {QPS_GOAL:g}/s", num(qps, 2), qps <= QPS_GOAL)
    ctx.results["idle"] = {
        "seconds": elapsed,
        "queries": queries,
        "qps": qps,
        "ticks": ticks,
        "per_statement": per_statement,
    }
