"""`pgferry bench fanout`: many subscriptions on one relay, each to its own endpoint (issue 16).

``subscriptions`` webhook subscriptions (one per endpoint: the receiver
process listens on as many loopback ports; with ``--one-endpoint`` all on one
port, each its own path, so that they share that endpoint's pool of
connections: issue 11's duplicates), one relay. ``events`` events are
published at ``rate`` per second, either all on one stream every
subscription follows (``--layout shared``: every event goes to every
endpoint) or ``events`` on each subscription's own stream (``own``: one
webhook per customer). Reported: deliveries, duplicates and losses per
(subscription, event), requests the relay took back before the wire
(``pgferry_requests_withdrawn_total``: waiting for a connection when their
round let go), commit-to-receipt latency, the database's transactions per
second while it ran, and the relay's CPU and peak memory.

The brief's targets: every event exactly once, p99 commit-to-receipt <= 1 s.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import click
import orjson

from pgferry import db
from pgferry.bench.brokers import free_port
from pgferry.bench.context import BENCH_DATABASE, BenchContext
from pgferry.bench.procstat import children, memory_mb, tree_cpu_seconds
from pgferry.bench.relay import running_relay
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import named, query
from pgferry.ops.metrics import parse_samples, series_sum

TARGET_P99_MS = 1000.0
LAYOUTS = ("shared", "own")


@dataclass(frozen=True)
class FanoutSettings:
    subscriptions: int = 1000
    events: int = 100
    rate: float = 5.0
    layout: str = "shared"
    timeout: float = 120.0
    #: relay processes (`pgferry run --processes`)
    processes: int = 1
    #: every subscription's URL on one host:port (each its own path): they share its connections
    one_endpoint: bool = False
    #: seconds the receiver holds every answer once, 2 s after the first request (0: never)
    stall: float = 0.0
    #: more subscriptions, each on a stream nothing writes: what idle ones cost the busy ones
    idle: int = 0

    def __post_init__(self) -> None:
        if (
            self.subscriptions < 1
            or self.events < 1
            or self.rate <= 0
            or self.processes < 1
            or self.stall < 0
            or self.idle < 0
        ):
            raise ValueError("subscriptions, events and processes must be >= 1, rate > 0, stall and idle >= 0")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}")


def _q(name: str) -> str:
    return named("fanout.sql", name)


class _ReceiverProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def score(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"?\n")
        await self.proc.stdin.drain()
        return orjson.loads(await self.proc.stdout.readline())  # type: ignore[no-any-return]


async def run_fanout_bench(ctx: BenchContext, s: FanoutSettings) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pgferry.bench.fanout_receiver", "--ports", str(1 if s.one_endpoint else s.subscriptions),
        "--stall", str(s.stall), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 30,
    )  # fmt: skip
    receiver = _ReceiverProcess(proc)
    try:
        assert proc.stdout is not None
        ports = orjson.loads(await proc.stdout.readline())
        if s.one_endpoint:
            ports = ports * s.subscriptions
        async with ctx.connect() as conn:
            await conn.execute(_q("subscribe"), ports, s.layout == "shared")
            await conn.execute(_q("subscribe_idle"), s.idle)
        where = "one endpoint" if s.one_endpoint else "each its own endpoint"
        stall = f", the receiver stalls {s.stall:g} s once" if s.stall else ""
        idle = f", {s.idle:,} idle ones" if s.idle else ""
        ctx.progress(f"[fanout] {s.subscriptions:,} subscriptions ({where}){idle}, {s.events} events at {s.rate:g}/s "
                     f"({s.layout}){stall}")  # fmt: skip
        metrics_port = free_port()
        args = ["--processes", str(s.processes), "--metrics-port", str(metrics_port)]
        async with running_relay(ctx.url, max_seconds=s.timeout + s.events / s.rate + 120, args=args) as relay:
            result = await _load(ctx, s, receiver, relay.pid)
            result["withdrawn"] = await _metric_sum(metrics_port, "pgferry_requests_withdrawn_total")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    _report(ctx, s, result)


async def _load(ctx: BenchContext, s: FanoutSettings, receiver: _ReceiverProcess, relay_pid: int) -> dict[str, Any]:
    expected = s.subscriptions * s.events
    admin = await db.connect(ctx.admin_url)
    try:
        async with ctx.connect() as conn:
            settle = time.monotonic() + 60
            while int(await conn.fetchval(_q("spread"), (s.subscriptions + s.idle) // s.processes)) < s.processes:
                if time.monotonic() > settle:
                    raise click.ClickException(f"the relay's {s.processes} processes did not share the subscriptions")
                await asyncio.sleep(0.5)
            xacts_before = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE))
            cpu_before = tree_cpu_seconds(relay_pid)
            started = time.monotonic()
            for n in range(s.events):  # one transaction per event (own: one event per stream)
                await conn.execute(_q("publish"), n, s.subscriptions, s.layout == "shared")
                await asyncio.sleep(max(0.0, started + (n + 1) / s.rate - time.monotonic()))
            published = time.monotonic()
            deadline = published + s.timeout
            while True:
                got = await receiver.score()
                delivered = sum(len(v) for v in got["by_path"].values())
                if delivered >= expected or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            elapsed = time.monotonic() - started
            xacts = int(await admin.fetchval(query("database_xacts"), BENCH_DATABASE)) - xacts_before
    finally:
        await admin.close()
    per_path = {path: Counter(ns) for path, ns in got["by_path"].items()}
    distinct = sum(len(c) for c in per_path.values())
    latencies = sorted(got["latencies_ms"])
    return {
        "expected": expected,
        "delivered": delivered,
        "distinct": distinct,
        "duplicates": delivered - distinct,
        "connections": got["connections"],
        "peak_open": got["peak_open"],
        "lost": expected - distinct,
        "p50_ms": _pct(latencies, 0.50),
        "p99_ms": _pct(latencies, 0.99),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "seconds": elapsed,
        "db_tps": xacts / elapsed,
        "relay_cpu_s": tree_cpu_seconds(relay_pid) - cpu_before,
        "relay_peak_mb": sum(memory_mb(pid).get("VmHWM", 0.0) for pid in [relay_pid, *children(relay_pid)]),
    }


async def _metric_sum(port: int, name: str) -> float:
    """A series of the relay's metrics, summed over its labels (and processes)."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return series_sum(parse_samples(text), name)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _report(ctx: BenchContext, s: FanoutSettings, r: dict[str, Any]) -> None:
    where = "all on one endpoint (host:port)" if s.one_endpoint else "each its own endpoint"
    stall = f"; the receiver stalled {s.stall:g} s once" if s.stall else ""
    stall += f"; {s.idle:,} more subscriptions on streams nothing writes" if s.idle else ""
    click.echo(f"\nFan-out: {s.subscriptions:,} subscriptions, {where}; {s.events} events "
               f"at {s.rate:g}/s, layout {s.layout}; one relay, {s.processes} process(es){stall}")  # fmt: skip
    click.echo(
        table(
            ["deliveries", "lost", "dupes", "withdrawn", "conns", "peak open", "p50 ms", "p99 ms", "max ms",
             "DB tx/s", "relay CPU", "relay peak MB"],
            [[num(r["delivered"]), num(r["lost"]), num(r["duplicates"]), num(r["withdrawn"]), num(r["connections"]),
              num(r["peak_open"]), num(r["p50_ms"], 1),
              num(r["p99_ms"], 1),
              num(r["max_ms"], 1), num(r["db_tps"]), f"{r['relay_cpu_s'] / r['seconds']:.0%}",
              num(r["relay_peak_mb"])]],
        )
    )  # fmt: skip
    click.echo("   latency: receipt minus the publishing statement's clock_timestamp(); DB tx/s: pg_stat_database "
               "transactions over the run, publishing included; relay CPU: share of one core, all its processes; "
               "relay peak MB: the sum of its processes' peaks; withdrawn: requests taken back before the wire "
               "(waiting for a connection when their round let go; sent later, once); conns: connections the "
               "receiver accepted; peak open: the most open at once")  # fmt: skip
    ctx.results["fanout"] = r
    ok = r["lost"] == 0 and r["duplicates"] == 0
    ctx.target("fanout", "every event exactly once", "0 lost, 0 dupes", f"{r['lost']} / {r['duplicates']}", ok)
    ctx.target("fanout", "p99 commit-to-receipt", f"<= {TARGET_P99_MS:g} ms", num(r["p99_ms"], 1),
               r["p99_ms"] <= TARGET_P99_MS)  # fmt: skip
