"""Section `wal` of `pgferry bench capture`: capture from the write-ahead log, side by side.

1. What it costs the writer: single-row inserts into a table without capture, one with
   pgferry's trigger and one captured from the WAL, interleaved, with the decoder
   (capture/wal.py) running in this process during the WAL cell, as a relay would.
2. Decode-and-append: a backlog of rows written while the decoder was stopped, then the
   time it takes to bring them into the log; as many transactions (a relay catching up:
   the target) and as one (protocol 1 sends a transaction only once the server has
   decoded all of it, so that time is not shared with the relay's).
3. Commit to log: a paced writer at ``--rate`` rows/s with the decoder running; each
   event's commit time (its created_at) against the moment a poller first sees it in
   ``ferry.events``.
4. Commit to tick: transactions writing a trigger-captured and a WAL-captured table at
   ``--rate`` rows/s with the decoder and the relay's ticker running, the ticker waiting
   for WAL capture (``wal_order_wait`` 250 ms, the default; migration 0028) and not (0), alternating: how
   long each kind of event takes to be in a tick, and how many transactions have both their
   events in the same batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import click

from pgferry import db
from pgferry.bench.context import BenchContext
from pgferry.bench.pgbench import PgbenchRun, run_pgbench
from pgferry.bench.report import Latency, ms, num, pct, table
from pgferry.bench.sqlfiles import pgbench_script
from pgferry.capture.wal import WalCapture
from pgferry.log.ticker import Ticker
from pgferry.log.ticks import Snapshot, commit_ticks

VARIANTS = {"plain": "bench_plain", "trigger": "bench_capture", "wal": "bench_wal"}
WRITER_GOAL = 0.95
DECODE_GOAL = 50_000
LATENCY_GOAL_MS = 100.0
BACKLOG_ROWS = 300_000
#: section 4's ticker: waiting for WAL capture (the default) and not
ORDER_MODES = {"waits (250 ms)": "250 ms", "does not wait": "0"}
#: backlog shape -> rows per transaction
BACKLOGS = {"30 transactions of 10,000 rows": 10_000, "one transaction of 300,000 rows": BACKLOG_ROWS}


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

        # 2. A backlog, decoded and appended: many transactions (a relay catching up), and one
        # huge one (the server decodes all of it before it sends the first change).
        backlogs = {shape: await _backlog(ctx, conn, per_tx) for shape, per_tx in BACKLOGS.items()}

        # 3. Commit to log at a steady rate.
        latency = await _commit_to_log(ctx, conn)

        # 4. Commit to tick, with and without the ticker waiting for WAL capture.
        ordering: dict[str, list[_Ticked]] = defaultdict(list)
        for round_no in range(s.rounds):
            modes = list(ORDER_MODES.items())
            for mode, wait in modes[round_no % 2 :] + modes[: round_no % 2]:
                ordering[mode].append(await _commit_to_tick(ctx, conn, wait))
                ctx.progress(f"[wal] commit to tick, the ticker {mode}: done")
        await conn.execute("update ferry.config set wal_order_wait = default")

    _report(ctx, runs, backlogs, latency)
    _report_ordering(ctx, ordering)


async def _backlog(ctx: BenchContext, conn: asyncpg.Connection, per_tx: int) -> tuple[int, float]:
    """Rows written with the decoder stopped, then the seconds until the log has them."""
    await conn.execute("truncate bench_wal, ferry.events")
    for first in range(0, BACKLOG_ROWS, per_tx):
        await conn.execute(
            "insert into bench_wal (account, amount, note) "
            "select g % 100000, g * 0.01, 'pgferry bench row' from generate_series($1::int, $2::int) g",
            first + 1, first + per_tx,
        )  # fmt: skip
    started = time.perf_counter()
    async with decoding(ctx.url):
        await wait_caught_up(conn)
    seconds = time.perf_counter() - started
    rows = await conn.fetchval("select count(*) from ferry.events where stream = 'bench.wal'")
    ctx.progress(f"[wal] backlog of {per_tx:,}-row transactions: {rows:,} rows in {seconds:.2f} s")
    return int(rows), seconds


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


@dataclass
class _Ticked:
    """Section 4, one cell: ms from commit to the tick that sees it, per kind; pairs in one tick."""

    trigger_ms: list[float]
    wal_ms: list[float]
    same_tick: int
    pairs: int


async def _commit_to_tick(ctx: BenchContext, conn: asyncpg.Connection, wait: str) -> _Ticked:
    """Mixed transactions (a trigger-captured row and a WAL-captured one each) at --rate rows/s,
    the decoder and the relay's ticker running; then, from the ticks' snapshots, each event's
    commit tick and its delay: the tick's created_at less the event's (its transaction's start
    for the trigger's event; the commit, from the WAL, for the other)."""
    s = ctx.settings
    await conn.execute("truncate bench_capture, bench_wal, ferry.events")
    await conn.execute("update ferry.config set wal_order_wait = $1::text::interval", wait)
    script = pgbench_script("insert_mixed")
    stop = asyncio.Event()
    async with decoding(ctx.url) as capture, ctx.connect() as ticking:
        ticker = Ticker(ticking)
        task = asyncio.create_task(ticker.run(stop))
        try:
            await conn.execute("insert into bench_wal (account, amount, note) values (0, 0, 'warm-up')")
            deadline = time.monotonic() + 120
            while not capture.events:
                if time.monotonic() > deadline:
                    raise RuntimeError("WAL capture did not start")
                await asyncio.sleep(0.01)
            first_tick = await conn.fetchval("select max(id) from ferry.ticks")
            await run_pgbench(ctx.url, script, clients=4, seconds=s.seconds, rate=s.rate / 2)
            await wait_caught_up(conn)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            await task
    ticks = await conn.fetch(
        "select id, snapshot::text, created_at from ferry.ticks where id >= $1 order by id", first_tick
    )
    events = await conn.fetch(
        "select e.stream, e.txid::text::bigint as txid, e.created_at, e.payload->>'note' as tag "
        "from ferry.events e where e.stream in ('bench.capture', 'bench.wal') and e.payload->>'note' <> 'warm-up'"
    )
    at = {t["id"]: t["created_at"] for t in ticks}
    found = commit_ticks([e["txid"] for e in events], [(t["id"], Snapshot.parse(t["snapshot"])) for t in ticks])
    delays: dict[str, list[float]] = defaultdict(list)
    tick_of: dict[tuple[str, str], int] = {}
    for e, k in zip(events, found, strict=True):
        if k is None:
            continue
        delays[e["stream"]].append((at[k] - e["created_at"]).total_seconds() * 1000)
        tick_of[(e["stream"], e["tag"])] = k
    tags = {tag for stream, tag in tick_of if stream == "bench.capture"}
    pairs = [tag for tag in tags if ("bench.wal", tag) in tick_of]
    same = sum(tick_of[("bench.capture", tag)] == tick_of[("bench.wal", tag)] for tag in pairs)
    return _Ticked(delays["bench.capture"], delays["bench.wal"], same, len(pairs))


def _report_ordering(ctx: BenchContext, ordering: dict[str, list[_Ticked]]) -> None:
    s = ctx.settings
    click.echo(
        f"\n   commit to tick: transactions of a trigger-captured and a WAL-captured row at {num(s.rate)} rows/s, "
        "4 clients, the relay's ticker"
    )
    out = []
    for mode, cells in ordering.items():
        trigger = Latency.of([x for c in cells for x in c.trigger_ms])
        wal = Latency.of([x for c in cells for x in c.wal_ms])
        pairs = sum(c.pairs for c in cells)
        same = sum(c.same_tick for c in cells)
        out.append([mode, ms(trigger.p50), ms(trigger.p99), ms(wal.p50), ms(wal.p99),
                    pct(100 * same / pairs if pairs else 0), f"{pairs:,}"])  # fmt: skip
    click.echo(table(["ticker", "trigger p50 ms", "p99 ms", "WAL p50 ms", "p99 ms", "same batch", "transactions"], out))
    ctx.results["wal_order"] = {
        mode: {"same_tick": sum(c.same_tick for c in cells), "pairs": sum(c.pairs for c in cells)}
        for mode, cells in ordering.items()
    }


def _report(
    ctx: BenchContext,
    runs: dict[tuple[int, str], list[PgbenchRun]],
    backlogs: dict[str, tuple[int, float]],
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
    click.echo("\n   decode-and-append: rows written with the decoder stopped, then started")
    rates = {}
    for shape, (rows, seconds) in backlogs.items():
        rates[shape] = rows / seconds
        click.echo(
            f"     {shape}: {rows:,} rows in the log {seconds:.2f} s after it started: {num(rates[shape])} rows/s"
        )
    click.echo(f"   commit to log at {num(s.rate)} rows/s: p50 {ms(latency.p50)} ms, p99 {ms(latency.p99)} ms, "
               f"max {ms(latency.max)} ms ({latency.count:,} events)")  # fmt: skip
    many = rates[next(iter(BACKLOGS))]
    ctx.target("wal", "decode-and-append (a backlog of transactions)", f">= {DECODE_GOAL:,} rows/s", num(many),
               many >= DECODE_GOAL)  # fmt: skip
    ctx.target("wal", f"commit to log p99 at {num(s.rate)} rows/s", f"<= {LATENCY_GOAL_MS:g} ms", ms(latency.p99),
               latency.p99 <= LATENCY_GOAL_MS)  # fmt: skip
    ctx.results["wal"] = {"decode_rows_per_s": rates, "commit_to_log_ms": vars(latency)}
