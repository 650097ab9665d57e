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
from typing import Any

import asyncpg
import click

import pgferry
from pgferry import db
from pgferry import sql as core_sql
from pgferry.bench.context import BENCH_DATABASE, BenchContext
from pgferry.bench.procstat import cpu_seconds, parent, tree_cpu_seconds
from pgferry.bench.relay import running_relay, wait_for_lock
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import named, query
from pgferry.schema import CONSUMER_LOCK_CLASS

CONSUMER = "bench-idle"
SETTLE_S = 4.0
#: With many subscriptions, the start-up burst (each worker's first reads) must not be counted:
#: an idle backend reports its counts up to 10 s late (PGSTAT_IDLE_INTERVAL), so wait longer,
#: and longer still with more subscriptions (the burst of 5,000 took ~15 s: two reads each).
SETTLE_MANY_S = 11.0
SETTLE_PER_SUBSCRIPTION_S = 0.004
QPS_GOAL = 5.0
#: issue 16: idle cost independent of the number of subscriptions
MANY_QPS_GOAL = 10.0
#: backends publish their transaction counts at most once a second
STATS_FLUSH_S = 1.5


async def _read(ferry: pgferry.Ferry, received: list[int]) -> None:
    async for batch in ferry.read(CONSUMER):
        received.append(len(batch))
        await batch.ack()


async def _calls(admin: asyncpg.Connection) -> dict[str, int]:
    return {r["query"]: int(r["calls"]) for r in await admin.fetch(query("statement_calls"), BENCH_DATABASE)}


def _settle(subscriptions: int) -> float:
    return SETTLE_MANY_S + SETTLE_PER_SUBSCRIPTION_S * subscriptions if subscriptions else SETTLE_S


async def run_idle(ctx: BenchContext) -> None:
    """Measured twice in one run: the relay with one reader, then with ``idle_subscriptions``
    webhook subscriptions on a stream nothing writes added (issue 16: the cost must not grow)."""
    rows = []
    for subscriptions in sorted({0, ctx.settings.idle_subscriptions}):
        result = await _measure_idle(ctx, subscriptions)
        ctx.results[f"idle_{subscriptions}" if subscriptions else "idle"] = result
        rows.append(result)
    seconds = rows[0]["seconds"]
    click.echo(
        f"\n4. Idle cost: relay + one waiting stream reader (+ N idle subscriptions), no writes, {seconds:.1f} s"
    )
    click.echo(
        table(
            ["subscriptions", "ready after s", "queries", "per second", "ticks", "relay CPU s", "PostgreSQL CPU s"],
            [[num(r["subscriptions"]), num(r["ready_s"], 1), num(r["queries"]), num(r["qps"], 2), num(r["ticks"]),
              num(r["relay_cpu_s"], 2), "-" if r["database_cpu_s"] is None else num(r["database_cpu_s"], 2)]
             for r in rows],
        )
    )  # fmt: skip
    click.echo(
        "   (pg_stat_database transaction counters; backends report them about once a second; ready after:"
        " from starting `pgferry run` until it delivers every subscription)"
    )
    for r in rows:
        if r["per_statement"]:
            click.echo(f"   by statement, {r['subscriptions']} subscriptions (pg_stat_statements):")
            click.echo(
                table(
                    ["calls/s", "statement"],
                    [
                        [num(n / r["seconds"], 2), " ".join(q.split())[:90]]
                        for q, n in sorted(r["per_statement"].items(), key=lambda item: -item[1])
                    ],
                )
            )
    qps = rows[0]["qps"]
    ctx.target("idle", "queries/s while idle", f"<= {QPS_GOAL:g}/s", num(qps, 2), qps <= QPS_GOAL)
    if len(rows) > 1:
        many = rows[-1]
        ctx.target(
            "idle",
            f"queries/s with {many['subscriptions']:,} idle subscriptions",
            f"<= {MANY_QPS_GOAL:g}/s",
            num(many["qps"], 2),
            many["qps"] <= MANY_QPS_GOAL,
        )


async def _measure_idle(ctx: BenchContext, subscriptions: int) -> dict[str, Any]:
    seconds = ctx.settings.idle_seconds
    received: list[int] = []
    admin = await db.connect(ctx.admin_url)
    try:
        async with ctx.connect() as conn:
            await conn.execute(query("idle_subscribe"), subscriptions)
            # Leave autovacuum nothing to do during the window.
            await conn.execute(query("vacuum_analyze"))
            await ctx.checkpoint(conn)
            launched = time.monotonic()
            async with (
                running_relay(ctx.url, max_seconds=seconds + _settle(subscriptions) + 120) as relay,
                pgferry.connect(ctx.url, pool_size=1) as ferry,
            ):
                # The relay started and delivers every subscription (running_relay waits for that).
                ready_s = time.monotonic() - launched
                reader = asyncio.create_task(_read(ferry, received))
                try:
                    lock_key = await conn.fetchval(core_sql.query("consumer_lock_key"), CONSUMER)
                    await wait_for_lock(conn, lock_key, "the stream reader", classid=CONSUMER_LOCK_CLASS)
                    settle = _settle(subscriptions)
                    ctx.progress(f"[idle] relay, one reader and {subscriptions} idle subscriptions for "
                                 f"{seconds:g} s (after {settle:g} s to settle)")  # fmt: skip
                    await asyncio.sleep(settle)
                    first_tick = int(await conn.fetchval(query("last_tick_id")))
                    await asyncio.sleep(STATS_FLUSH_S)  # let that query's count land before the window
                    breakdown = bool(await admin.fetchval(query("has_pg_stat_statements")))
                    started = time.monotonic()
                    cpu_before = cpu_seconds(relay.pid)
                    # PostgreSQL's CPU too (the postmaster and its backends; None: the server is not on
                    # this machine): an idle relay once cost no queries but a fifth of a core in JIT.
                    postmaster = parent(int(await conn.fetchval(named("streams.sql", "backend_pid"))))
                    db_cpu_before = tree_cpu_seconds(postmaster) if postmaster is not None else 0.0
                    before = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE))
                    calls_before = await _calls(admin) if breakdown else {}
                    await asyncio.sleep(seconds)
                    after = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE))
                    calls_after = await _calls(admin) if breakdown else {}
                    cpu = cpu_seconds(relay.pid) - cpu_before
                    db_cpu = tree_cpu_seconds(postmaster) - db_cpu_before if postmaster is not None else None
                    elapsed = time.monotonic() - started
                    ticks = int(await conn.fetchval(query("last_tick_id"))) - first_tick
                finally:
                    reader.cancel()
                    (outcome,) = await asyncio.gather(reader, return_exceptions=True)
                if isinstance(outcome, Exception):
                    raise outcome
            await conn.execute(query("idle_unsubscribe"))
    finally:
        await admin.close()

    queries = after - before
    return {
        "subscriptions": subscriptions,
        "ready_s": ready_s,
        "seconds": elapsed,
        "queries": queries,
        "qps": queries / elapsed,
        "ticks": ticks,
        "relay_cpu_s": cpu,
        "database_cpu_s": db_cpu,
        "per_statement": {
            q: calls_after[q] - calls_before.get(q, 0) for q in calls_after if calls_after[q] > calls_before.get(q, 0)
        },
    }
