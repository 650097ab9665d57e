"""4. Connect storm: thousands of SSE clients at once while a control client follows a live stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import click

from pgferry.bench import procstat
from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.report import Latency, ms, num, table
from pgferry.bench.sqlfiles import pgbench_script
from pgferry.bench.streams.common import (
    STORM_KB_PER_CLIENT_LIMIT,
    STORM_P99_LIMIT_MS,
    WARM_UP_S,
    Bench,
    Relay,
    StreamsSettings,
    api_relay,
    clients,
    close_streams,
    latency_of,
    loss,
    progress,
    published,
)

# -- 4. connect storm --------------------------------------------------------------------------------------

#: Seconds of control traffic before the first storm starts; seconds the storm's clients stay connected
#: once all are in, and the relay gets after they leave (both at most --seconds).
STORM_LEAD_S = 3.0
STORM_HOLD_S = 3.0
#: The control writer runs as pgbench runs of this many seconds, one after another, until told to stop.
CONTROL_SEGMENT_S = 5.0


@dataclass
class StormRound:
    admitted: int
    failed: int
    all_in_s: float
    connect: Latency  # seconds from the storm's start to each client's admission
    cpu: dict[str, float]  # while connecting
    connecting_s: float
    rss_before: float
    rss_held: float  # all connected
    rss_after: float  # after they left
    peak: float  # VmHWM so far
    started_at: float  # wall clock
    admitted_at: float
    left_at: float
    failures: dict[str, int]
    queries: float  # the relay's, from the start until they left
    db_share: float  # the relay's statements' execution time per second, meanwhile (100%: one backend)


async def _control_writer(url: str, rate: float, stop: asyncio.Event) -> None:
    script = pgbench_script("streams", prefix="control:", streams="1")
    while not stop.is_set():
        await run_pgbench(url, script, clients=1, seconds=CONTROL_SEGMENT_S, rate=rate)


async def _storm(bench: Bench, relay: Relay, k: int, timeout: float, hold: float) -> StormRound:
    """``k`` clients connecting at once, held ``hold`` seconds once all are in, then gone."""
    before = procstat.memory_mb(relay.pid).get("VmRSS", 0.0)
    statements = await bench.snapshot()
    cpu = bench.cpu_window()
    started_at, started = time.time(), time.monotonic()
    async with clients(relay.base, "catchup", "storm:{}", k, timeout=timeout + 60) as storm:
        bench.client_pid = storm.proc.pid
        admitted = await storm.ready(timeout=timeout)
        admitted_at, connecting_s = time.time(), time.monotonic() - started
        used = cpu()
        bench.client_pid = None
        await asyncio.sleep(hold)
        held = procstat.memory_mb(relay.pid)
        window = bench.window(statements, await bench.snapshot(), 0)
        left_at = time.time()
        storm.proc.terminate()
        result = await storm.result(timeout=60)
    await asyncio.sleep(hold)
    after = procstat.memory_mb(relay.pid)
    return StormRound(
        int(admitted["admitted"]),
        int(admitted["failed"]),
        float(admitted["seconds"]),
        Latency.of(result["connect_s"]),
        used,
        connecting_s,
        before,
        held.get("VmRSS", 0.0),
        after.get("VmRSS", 0.0),
        held.get("VmHWM", 0.0),
        started_at,
        admitted_at,
        left_at,
        dict(result["failures"]),
        sum(window.relay_queries.values()),
        window.relay_db_share,
    )


async def run_storm(bench: Bench, settings: StreamsSettings) -> None:
    k, rounds, hold = settings.storm_clients, settings.storm_rounds, min(STORM_HOLD_S, settings.seconds)
    progress(
        f"[storm] {rounds} x {k:,} SSE clients connecting at once; a control client on a stream at "
        f"{settings.control_rate:g} events/s ..."
    )
    done: list[StormRound] = []
    stop = asyncio.Event()
    async with api_relay(bench.url, 300 + rounds * 300) as relay, clients(relay.base, "follow", "control:0") as control:
        bench.relay_pid = relay.pid
        try:
            await control.ready(timeout=60)
            writer = asyncio.create_task(_control_writer(bench.writer_url, settings.control_rate, stop))
            load_at = time.time()
            await asyncio.sleep(min(STORM_LEAD_S, settings.seconds))
            try:
                for r in range(rounds):
                    done.append(await _storm(bench, relay, k, settings.storm_timeout, hold))
                    progress(
                        f"[storm]   round {r + 1}: {done[-1].admitted:,} in {done[-1].all_in_s:.1f} s, relay RSS "
                        f"{done[-1].rss_before:.0f} -> {done[-1].rss_held:.0f} -> {done[-1].rss_after:.0f} MB"
                    )
            finally:
                stop.set()
                await writer
            await close_streams(bench.url, ["control:0"])
            control_result = await control.result(timeout=60)
        finally:
            bench.relay_pid = None
    committed, lost = loss(await published(bench.url, "control:%"), control_result["per_stream"])
    first = done[0]
    quiet = latency_of(control_result, load_at + WARM_UP_S, first.started_at)
    during = Latency.of(
        [
            lat
            for r in done
            for at, lat in control_result["latencies"]
            if r.started_at <= at - lat / 1000 < r.admitted_at
        ]
    )
    held = Latency.of(
        [lat for r in done for at, lat in control_result["latencies"] if r.admitted_at <= at - lat / 1000 < r.left_at]
    )
    click.echo(
        f"\n4. Connect storm: {k:,} SSE clients (one process) connecting at once, each to its own (idle) stream, "
        f"held {hold:g} s once all are in, then gone; {rounds} round(s) on one relay; meanwhile a control "
        f"client follows a stream pgbench publishes {settings.control_rate:g} events/s to"
    )
    click.echo(
        table(
            [
                "round",
                "admitted",
                "failed",
                "all in s",
                "p50 s",
                "p99 s",
                "queries/client",
                "relay DB time",
                "CPU relay",
                "clients",
                "postgres",
                "RSS MB before",
                "all in",
                "after",
                "peak",
            ],
            [
                [
                    str(i + 1),
                    num(r.admitted),
                    num(r.failed),
                    f"{r.all_in_s:.2f}",
                    f"{r.connect.p50:.2f}",
                    f"{r.connect.p99:.2f}",
                    num(r.queries / max(1, r.admitted), 1),
                    f"{r.db_share:.0f}%",
                    *(f"{100 * r.cpu.get(p, 0.0) / r.connecting_s:.0f}%" for p in ("relay", "clients", "postgres")),
                    f"{r.rss_before:.0f}",
                    f"{r.rss_held:.0f}",
                    f"{r.rss_after:.0f}",
                    f"{r.peak:.0f}",
                ]
                for i, r in enumerate(done)
            ],
        )
    )
    click.echo(
        table(
            ["control client", "events", "p50 ms", "p90 ms", "p99 ms", "max ms"],
            [
                [label, num(lat.count), ms(lat.p50), ms(lat.p90), ms(lat.p99), ms(lat.max)]
                for label, lat in (("before the storm", quiet), ("while connecting", during), ("all connected", held))
            ],
        )
    )
    failures = {reason: n for r in done for reason, n in r.failures.items()}
    per_client_kb = max(r.rss_held - first.rss_before for r in done) * 1024 / max(1, k)
    click.echo(
        "   all in s: from the first connect to the last client admitted (HTTP 200 and the first frame); p50/p99 s: "
        "when each was admitted; queries/client: the relay's statements from the start until they left, per client "
        "(reading each one's history before it joins the live feed); relay DB time: their execution time per "
        "second meanwhile (100% = one backend always busy); CPU: while they connected, 100% = one core; "
        "RSS: the relay's, before the round, "
        f"all connected (+{hold:g} s), {hold:g} s after they left, and its peak (VmHWM) so far; "
        f"control: events committed while connecting / from then until they left, {committed:,} committed in all, lost "
        f"{lost}; storm failures: {failures or 'none'}"
    )
    bench.results["storm"] = {
        "rounds": [vars(r) | {"connect": vars(r.connect)} for r in done],
        "control": {"quiet": vars(quiet), "during": vars(during), "held": vars(held)},
        "control_committed": committed,
        "control_lost": lost,
    }
    all_in = all(r.admitted == k for r in done)
    bench.target(
        "storm",
        f"{k:,} clients at once: all admitted",
        f"{k:,} each round",
        ", ".join(f"{r.admitted:,} in {r.all_in_s:.1f} s" for r in done),
        all_in,
    )
    bench.target(
        "storm",
        "the relay keeps serving: control while connecting",
        f"p99 <= {STORM_P99_LIMIT_MS:,.0f} ms, lost 0",
        f"p99 {ms(during.p99)} ms (max {ms(during.max)}), lost {lost}",
        lost == 0 and committed > 0 and not during.p99 > STORM_P99_LIMIT_MS,
    )
    grown = done[-1].peak - first.peak if rounds > 1 else 0.0
    bench.target(
        "storm",
        "relay memory bounded",
        f"<= {STORM_KB_PER_CLIENT_LIMIT:g} KB/connection; no growth round over round",
        f"{per_client_kb:.1f} KB/connection; peak {first.peak:.0f} -> {done[-1].peak:.0f} MB",
        per_client_kb <= STORM_KB_PER_CLIENT_LIMIT and grown <= 0.1 * first.peak,
    )
