"""`pgferry bench webhooks`: the seed benchmark, delivered as webhooks.

Table ``spice_harvests`` is captured; pgbench inserts into it (10 clients,
2 threads, a fixed number of transactions); a relay (`pgferry run`, its own
process) delivers to a receiver in a third process that keeps score. For
each scenario we report: success rate (unique events received / rows
inserted), end-to-end throughput (events received / time from the first
insert to the last receipt), commit-to-receipt latency, how long after the
last commit the last event arrived, and sockets left in TIME_WAIT toward the
receiver (while the relay runs and after it stops). Each scenario starts
with a checkpoint and a warm-up of WARM_UP_ROWS rows that are delivered but
not scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import click
import orjson

from pgferry import db
from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.procstat import cpu_by_command, cpu_spent
from pgferry.bench.relay import running_relays
from pgferry.bench.report import Latency, ms, num
from pgferry.bench.sqlfiles import named
from pgferry.bench.tracking_receiver import LATENCIES_PATH, RESET_PATH, STATS_PATH
from pgferry.errors import PgferryError
from pgferry.schema import install

SINGLE_ROW = "insert into spice_harvests (harvester, amount) values ('harvester-' || :client_id, 1);\n"
HUNDRED_ROWS = (
    "insert into spice_harvests (harvester, amount)"
    " select 'harvester-' || :client_id, g from generate_series(1, 100) g;\n"
)
#: Rows inserted and delivered before each scenario, and not scored.
WARM_UP_ROWS = 1000


@dataclass(frozen=True)
class Scenario:
    name: str
    rows_per_tx: int
    batch_size: int
    transactions: int  # per client
    clients: int = 10
    fail_rate: float = 0.0
    drop_rate: float = 0.0
    # The subscription default is 32. At ~7K inserts/s a 10 ms tick brings ~70 events; with
    # 48 in flight they go out in two rounds instead of three (single-row p99 ~35 vs ~70 ms).
    max_in_flight: int = 48
    pg_net: bool = False  # through net.http_post in a row trigger instead of a subscription


def scenarios(scale: float) -> list[Scenario]:
    def t(n: int) -> int:
        return max(1, round(n * scale))

    return [
        Scenario("1-row inserts, batch 1", 1, 1, t(1000)),
        Scenario("100-row inserts, batch 100", 100, 100, t(1000)),
        Scenario("100-row inserts, batch 1", 100, 1, t(100)),
        Scenario("1-row inserts, receiver fails 10% (500) + drops 5%", 1, 1, t(1000), fail_rate=0.10, drop_rate=0.05),
        Scenario("pg_net API: net.http_post trigger, 1-row inserts", 1, 1, t(1000), pg_net=True),
        Scenario("pg_net API, receiver fails 10% (500)", 1, 1, t(1000), fail_rate=0.10, pg_net=True),
    ]


@dataclass(frozen=True)
class Deployment:
    """How the subscription and the relays are laid out (`pgferry bench scale`)."""

    partitions: int = 1
    processes: int = 1  # per relay (pgferry run --processes)
    relays: int = 1  # pgferry run commands

    @property
    def name(self) -> str:
        relays = f"{self.relays} relays x " if self.relays > 1 else ""
        return f"{relays}{self.processes} process{'es' if self.processes > 1 else ''}, {self.partitions} partition(s)"


@dataclass
class Outcome:
    scenario: Scenario
    inserted: int
    unique: int
    duplicates: int
    dead: int
    failed_attempts: int
    insert_seconds: float
    throughput: float
    latency: Latency
    last_after_commit_s: float
    time_wait_running: int
    time_wait_after: int
    timed_out: bool
    #: CPU seconds of the relay and the receiver from the first insert to the last receipt
    cpu: dict[str, float] = field(default_factory=dict)


#: The processes whose CPU a scenario reports, by a marker in their command line.
WEBHOOK_PARTIES = {"relay": "pgferry run", "sink": "pgferry.bench.tracking_receiver"}


@contextlib.asynccontextmanager
async def tracking_receiver(fail_rate: float, drop_rate: float) -> AsyncIterator[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pgferry.bench.tracking_receiver",
        "--fail-rate", str(fail_rate), "--drop-rate", str(drop_rate),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        yield url
    finally:
        proc.terminate()
        await proc.wait()


class ReceiverStats:
    """Polls the receiver's score over one kept-alive connection, so that the
    measuring itself leaves no sockets in TIME_WAIT toward the receiver."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = f"{parts.scheme}://{parts.netloc}{STATS_PATH}"
        self.reset_url = f"{parts.scheme}://{parts.netloc}{RESET_PATH}"
        self.latencies_url = f"{parts.scheme}://{parts.netloc}{LATENCIES_PATH}"
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))

    async def __call__(self) -> dict[str, Any]:
        async with self.session.get(self.url) as resp:
            return dict(await resp.json(content_type=None))

    async def latencies(self) -> list[float]:
        """Every commit-to-receipt latency since the reset (ms): once, at the end."""
        async with self.session.get(self.latencies_url) as resp:
            return list(orjson.loads(await resp.read()))

    async def reset(self) -> dict[str, Any]:
        """Starts the score afresh; returns the one it ended (no receipt falls between the two)."""
        async with self.session.get(self.reset_url) as resp:
            resp.raise_for_status()
            return dict(await resp.json(content_type=None))

    async def close(self) -> None:
        await self.session.close()


@contextlib.asynccontextmanager
async def stats_of(url: str) -> AsyncIterator[ReceiverStats]:
    stats = ReceiverStats(url)
    try:
        yield stats
    finally:
        await stats.close()


def time_wait_sockets(port: int) -> int:
    """The relay's TCP sockets toward ``port`` in TIME_WAIT (ss from iproute2)."""
    try:
        out = subprocess.run(
            ["ss", "-Htan", "state", "time-wait", f"( dport = :{port} )"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return -1
    return sum(1 for line in out.splitlines() if line.strip())


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Baseline:
    """Counts after the warm-up; a scenario scores what came after."""

    rows: int = 0
    net_ok: int = 0
    dead: int = 0
    failed_attempts: int = 0


async def _delivered(
    conn: asyncpg.Connection, scenario: Scenario, stats: dict[str, Any], baseline: Baseline
) -> tuple[int, float | None]:
    """(events delivered, time of the last delivery): receipts at the receiver for webhooks,
    responses with status 200 in net._http_response for the pg_net API."""
    if not scenario.pg_net:
        return stats["unique"], stats["last_at"]
    responses = await conn.fetchrow(named("webhooks.sql", "net_responses"))
    return responses["ok"] - baseline.net_ok, float(responses["last_at"]) if responses["last_at"] else None


async def warm_up(
    conn: asyncpg.Connection, url: str, scenario: Scenario, script: str, table: str, receiver: ReceiverStats,
    timeout: float,
) -> Baseline:  # fmt: skip
    """Insert and deliver WARM_UP_ROWS rows, then reset the score.

    Measuring starts in steady state: the relay's connections are open, and the
    pages the inserts and the relay change have had their first change since the
    scenario's checkpoint (which writes each whole page to WAL: measured, it put
    p99 at 50-80 ms for the first ~150 ms of a run, against ~25 ms after)."""
    per_client = max(1, WARM_UP_ROWS // (scenario.rows_per_tx * scenario.clients))
    await run_pgbench(url, script, clients=scenario.clients, transactions=per_client)
    rows = await conn.fetchval(named("webhooks.sql", "rows").replace("spice_harvests", table))
    deadline = time.time() + timeout
    while (await _delivered(conn, scenario, await receiver(), Baseline()))[0] < rows:
        if time.time() > deadline:
            raise PgferryError(f"the {rows} warm-up events were not delivered within {timeout:.0f} s")
        await asyncio.sleep(0.05)
    await receiver.reset()
    responses = await conn.fetchrow(named("webhooks.sql", "net_responses"))
    return Baseline(
        rows=rows,
        net_ok=responses["ok"],
        dead=await conn.fetchval(named("webhooks.sql", "dead")),
        failed_attempts=await conn.fetchval(named("webhooks.sql", "failed_attempts")),
    )


async def run_scenario(
    url: str,
    scenario: Scenario,
    timeout: float,
    rate: float | None = None,
    deployment: Deployment = Deployment(),
    backlog: bool = False,
) -> Outcome:
    """``backlog``: the subscription is paused while pgbench inserts and resumed after, and the
    throughput is the drain rate (events / (last receipt - first receipt)): what delivery alone
    reaches, the inserts not taking the cores meanwhile."""
    conn = await db.connect(url)
    try:
        async with tracking_receiver(scenario.fail_rate, scenario.drop_rate) as hook, stats_of(hook) as receiver_stats:
            if scenario.pg_net:
                # the seed's trigger calling net.http_post, with this receiver's URL
                await conn.execute(named("webhooks.sql", "setup_pg_net").replace("{hook_url}", _literal(hook)))
                await conn.execute(named("webhooks.sql", "reset_pg_net"))
                table = "spice_harvests_net"
            else:
                await conn.execute(named("webhooks.sql", "reset"))
                await conn.execute(
                    named("webhooks.sql", "subscribe"),
                    hook, scenario.batch_size, scenario.max_in_flight, deployment.partitions,
                )  # fmt: skip
                table = "spice_harvests"
            await conn.execute(named("webhooks.sql", "checkpoint"))  # no scenario pays for an earlier one's WAL
            port = urlsplit(hook).port or 80
            script = (SINGLE_ROW if scenario.rows_per_tx == 1 else HUNDRED_ROWS).replace("spice_harvests", table)
            async with running_relays(
                url, relays=deployment.relays, processes=deployment.processes, max_seconds=timeout + 600
            ):
                before = await warm_up(conn, url, scenario, script, table, receiver_stats, timeout)
                if backlog:
                    await conn.execute(named("webhooks.sql", "pause"))
                started = time.time()
                cpu_before = cpu_by_command(WEBHOOK_PARTIES)
                await run_pgbench(url, script, clients=scenario.clients, transactions=scenario.transactions, rate=rate)
                insert_end = time.time()
                # Delivered before the drain (the relay lets go of a paused subscription on its next round):
                # (unique, duplicates), counted apart, so that the drain's first receipt starts its rate.
                early, early_dups = 0, 0
                if backlog:
                    score = await receiver_stats.reset()
                    early, early_dups = score["unique"], score["duplicates"]
                    await conn.execute(named("webhooks.sql", "resume"))
                rows = await conn.fetchval(named("webhooks.sql", "rows").replace("spice_harvests", table))
                inserted = rows - before.rows
                deadline = insert_end + timeout
                stats = await receiver_stats()
                delivered, last_at = await _delivered(conn, scenario, stats, before)
                while early + delivered < inserted and time.time() < deadline:
                    await asyncio.sleep(0.2)
                    stats = await receiver_stats()
                    delivered, last_at = await _delivered(conn, scenario, stats, before)
                cpu = cpu_spent(cpu_before, cpu_by_command(WEBHOOK_PARTIES))
                latencies = await receiver_stats.latencies()
                time_wait_running = time_wait_sockets(port)
            time_wait_after = time_wait_sockets(port)
            dead = await conn.fetchval(named("webhooks.sql", "dead")) - before.dead
            failed = await conn.fetchval(named("webhooks.sql", "failed_attempts")) - before.failed_attempts
            for row in await conn.fetch(named("webhooks.sql", "failure_classes")):
                click.echo(f"  failed attempts: {row['n']} x {row['error_class']}", err=True)
    finally:
        await conn.close()
    last_at = last_at or insert_end
    # The drain rate after a backlog: what was left at the resume, from its first receipt.
    delivering_since = stats["first_at"] if backlog and stats["first_at"] else started
    return Outcome(
        scenario=scenario,
        inserted=inserted,
        unique=early + delivered,
        duplicates=early_dups + stats["duplicates"],
        dead=dead,
        failed_attempts=failed,
        insert_seconds=insert_end - started,
        throughput=delivered / max(1e-9, last_at - delivering_since),
        latency=Latency.of(latencies),
        last_after_commit_s=last_at - insert_end,
        time_wait_running=time_wait_running,
        time_wait_after=time_wait_after,
        timed_out=early + delivered < inserted,
        cpu=cpu,
    )


def print_table(outcomes: list[Outcome]) -> None:
    header = (
        f"{'scenario':<52} {'rows':>9} {'delivered':>9} {'success':>8} {'ev/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'last+s':>7} {'retried':>7} {'dups':>5} {'dead':>4} {'TW run':>6} {'TW end':>6}"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for o in outcomes:
        success = 100.0 * o.unique / o.inserted if o.inserted else float("nan")
        click.echo(
            f"{o.scenario.name:<52} {num(o.inserted):>9} {num(o.unique):>9} {success:>7.2f}% {num(o.throughput):>8}"
            f" {ms(o.latency.p50):>7} {ms(o.latency.p99):>7} {o.last_after_commit_s:>7.2f} {num(o.failed_attempts):>7}"
            f" {o.duplicates:>5}"
            f" {o.dead:>4} {o.time_wait_running:>6} {o.time_wait_after:>6}"
        )
    click.echo(
        "rows: inserted by pgbench -c 10 -j 2 -t N; success: unique events received / rows (pg_net rows: "
        "responses with status 200 in net._http_response / rows); ev/s: received / "
        "(last receipt - first insert); p50/p99: commit-to-receipt; last+s: last receipt after the last commit; "
        "retried: failed attempts (retried later); "
        "dups: events received more than once; TW run/end: the relay's sockets toward the receiver in TIME_WAIT "
        "with it running / after it stopped (pool: 64 connections per endpoint, max_in_flight 48)."
    )


async def prepare(url: str) -> None:
    """pgferry (with the pg_net add-on) and the seed's captured table, in the scratch database."""
    conn = await db.connect(url)
    try:
        await install(conn, addons=["pg_net"])
        await conn.execute(named("webhooks.sql", "setup"))
    finally:
        await conn.close()


async def run_webhooks_bench(
    url: str, scale: float, only: tuple[int, ...], timeout: float, rate: float | None = None
) -> list[Outcome]:
    await prepare(url)
    outcomes = []
    for number, scenario in enumerate(scenarios(scale), start=1):
        if only and number not in only:
            continue
        click.echo(f"scenario {number}: {scenario.name} ...", err=True)
        outcomes.append(await run_scenario(url, scenario, timeout, rate))
    return outcomes
