"""Section `wal` of `pgferry bench capture`: capture from the write-ahead log, side by side.

1. What it costs the writer: single-row inserts into a table without capture, one with
   pgferry's trigger and one captured from the WAL, interleaved, with the decoder
   (capture/wal.py) running in this process during the WAL cell, as a relay would.
2. Decode-and-append: a backlog of rows written while the decoder was stopped, then the
   time it takes to bring them into the log.
3. Commit to log: a paced writer at ``--rate`` rows/s with the decoder running; each
   event's commit time (its created_at) against the moment a poller first sees it in
   ``ferry.events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator

import asyncpg
import click

from pgferry import db
from pgferry.bench.context import BenchContext
from pgferry.bench.pgbench import PgbenchRun, run_pgbench
from pgferry.bench.report import Latency, ms, num, pct, table
from pgferry.bench.sqlfiles import pgbench_script
from pgferry.capture.wal import WalCapture

VARIANTS = {"plain": "bench_plain", "trigger": "bench_capture", "wal": "bench_wal"}
WRITER_GOAL = 0.95
DECODE_GOAL = 50_000
LATENCY_GOAL_MS = 100.0
BACKLOG_ROWS = 300_000


@contextlib.asynccontextmanager
async def decoding(url: str) -> AsyncIterator[WalCapture]:
    """The WAL decoder running on its own connection, as a relay runs it."""
    conn = await db.connect(url)
    capture = WalCapture(conn, url)
    stop = asyncio.Event()
    task = asyncio.create_task(capture.run(stop))
    try:
        yield capture
    finally:
        stop.set()
        await task
        await conn.close()


async def caught_up(conn: asyncpg.Connection) -> bool:
    """Whether the slot has been confirmed up to the WAL written so far (nothing left to decode)."""
    behind = await conn.fetchval(
        "select pg_current_wal_flush_lsn() - s.confirmed_flush_lsn from pg_replication_slots s "
        "join ferry.wal_slot w using (slot_name)"
    )
    return bool(behind is not None and behind < 16_384)


async def wait_caught_up(conn: asyncpg.Connection, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not await caught_up(conn):
        if time.monotonic() > deadline:
            raise RuntimeError("WAL capture did not catch up")
        await asyncio.sleep(0.02)


async def run_wal(ctx: BenchContext) -> None:
    s = ctx.settings
    async with ctx.connect() as conn:
        if await conn.fetchval("show wal_level") != "logical":
            click.echo("\nWAL capture: skipped, the server runs with wal_level other than logical")
            return
        await conn.execute("create table bench_wal (like bench_plain including all)")
        await conn.execute(
            "select ferry.capture_table('public.bench_wal', stream => 'bench.wal', operations => array['insert'], "
            "method => 'wal')"
        )
        runs: dict[tuple[int, str], list[PgbenchRun]] = defaultdict(list)
        names = list(VARIANTS)
        for round_no in range(s.rounds):
            for index, clients in enumerate(s.clients):
                shift = (index + round_no) % len(names)
                for variant in names[shift:] + names[:shift]:
                    await conn.execute("truncate bench_plain, bench_capture, bench_wal, ferry.events")
                    await ctx.checkpoint(conn)
                    script = pgbench_script("insert_one", table=VARIANTS[variant])
                    if variant == "wal":
                        async with decoding(ctx.url):
                            run = await run_pgbench(ctx.url, script, clients=clients, seconds=s.seconds)
                            await wait_caught_up(conn)
                    else:
                        run = await run_pgbench(ctx.url, script, clients=clients, seconds=s.seconds)
                    runs[(clients, variant)].append(run)
                    ctx.progress(f"[wal] {clients} clients, {variant:<7} {run.tps:>9,.0f} rows/s")
        # Catch up on what the other cells wrote, untimed.
        async with decoding(ctx.url):
            await wait_caught_up(conn)

        # 2. A backlog, decoded and appended.
        await conn.execute("truncate bench_wal, ferry.events")
        await conn.execute(
            "insert into bench_wal (account, amount, note) "
            "select g % 100000, g * 0.01, 'pgferry bench row' from generate_series(1, $1) g",
            BACKLOG_ROWS,
        )
        started = time.perf_counter()
        async with decoding(ctx.url):
            await wait_caught_up(conn)
        decode_s = time.perf_counter() - started
        in_log = await conn.fetchval("select count(*) from ferry.events where stream = 'bench.wal'")
        decode_rate = in_log / decode_s
        ctx.progress(f"[wal] backlog: {in_log:,} rows in {decode_s:.2f} s")

        # 3. Commit to log at a steady rate.
        latency = await _commit_to_log(ctx, conn)

    _report(ctx, runs, decode_rate, in_log, decode_s, latency)


async def _commit_to_log(ctx: BenchContext, conn: asyncpg.Connection) -> Latency:
    s = ctx.settings
    await conn.execute("truncate bench_wal, ferry.events")
    samples: list[float] = []
    stop = asyncio.Event()

    async def poll(reader: asyncpg.Connection) -> None:
        last = await reader.fetchval("select max(id) from ferry.events")
        while not stop.is_set():
            rows = await reader.fetch(
                "select id, extract(epoch from clock_timestamp() - created_at) * 1000 as ms "
                "from ferry.events where stream = 'bench.wal' and id > $1",
                last,
            )
            for r in rows:
                samples.append(float(r["ms"]))
                last = max(last, r["id"])
            await asyncio.sleep(0.002)

    script = pgbench_script("insert_many", table="bench_wal", rows="10")
    async with decoding(ctx.url), ctx.connect() as reader:
        # A relay's stream is open already: measure it warm. A row through it says it is (a new
        # stream first reads the server's WAL from the slot's restart point again).
        await conn.execute("insert into bench_wal (account, amount, note) values (0, 0, 'warm-up')")
        deadline = time.monotonic() + 120
        while not await conn.fetchval("select exists (select from ferry.events where stream = 'bench.wal')"):
            if time.monotonic() > deadline:
                raise RuntimeError("WAL capture did not start")
            await asyncio.sleep(0.01)
        poller = asyncio.create_task(poll(reader))
        await run_pgbench(ctx.url, script, clients=4, seconds=s.seconds, rate=s.rate / 10)
        await wait_caught_up(conn)
        await asyncio.sleep(0.2)
        stop.set()
        await poller
    return Latency.of(samples)


def _report(
    ctx: BenchContext,
    runs: dict[tuple[int, str], list[PgbenchRun]],
    decode_rate: float,
    rows: int,
    seconds: float,
    latency: Latency,
) -> None:
    s = ctx.settings
    click.echo(
        f"\nWAL capture: single-row inserts, pgbench -M prepared, {s.seconds:g} s per cell x {s.rounds} round(s), "
        "interleaved; the decoder runs in this process during the wal cell"
    )
    out = []
    for clients in s.clients:
        rate = {v: sum(r.tps * r.seconds for r in runs[(clients, v)]) / sum(r.seconds for r in runs[(clients, v)])
                for v in VARIANTS}  # fmt: skip
        for variant in VARIANTS:
            lat = Latency.of([x for r in runs[(clients, variant)] for x in r.latencies_ms])
            out.append([str(clients), variant, num(rate[variant]), ms(lat.p50), ms(lat.p99),
                        pct(100 * rate[variant] / rate["plain"])])  # fmt: skip
        ratio = rate["wal"] / rate["plain"]
        ctx.target("wal", f"writer with WAL capture vs none, {clients} clients", ">= 95%", pct(100 * ratio),
                   ratio >= WRITER_GOAL)  # fmt: skip
    click.echo(table(["clients", "variant", "rows/s", "p50 ms", "p99 ms", "vs plain"], out))
    click.echo(f"\n   decode-and-append: {rows:,} rows written with the decoder stopped, in the log "
               f"{seconds:.2f} s after it started: {num(decode_rate)} rows/s")  # fmt: skip
    click.echo(f"   commit to log at {num(s.rate)} rows/s: p50 {ms(latency.p50)} ms, p99 {ms(latency.p99)} ms, "
               f"max {ms(latency.max)} ms ({latency.count:,} events)")  # fmt: skip
    ctx.target("wal", "decode-and-append", f">= {DECODE_GOAL:,} rows/s", num(decode_rate), decode_rate >= DECODE_GOAL)
    ctx.target("wal", f"commit to log p99 at {num(s.rate)} rows/s", f"<= {LATENCY_GOAL_MS:g} ms", ms(latency.p99),
               latency.p99 <= LATENCY_GOAL_MS)  # fmt: skip
    ctx.results["wal"] = {"decode_rows_per_s": decode_rate, "commit_to_log_ms": vars(latency)}
