"""What the scenarios of `pgferry bench streams` share: settings, the processes (relay, clients), the
database's counters, and what the run found."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import click
import orjson

from pgferry import db
from pgferry.bench import procstat
from pgferry.bench.context import BENCH_DATABASE, Target
from pgferry.bench.relay import running_relay
from pgferry.bench.report import Latency
from pgferry.bench.sqlfiles import named, query
from pgferry.embedded import free_port
from pgferry.errors import PgferryError

SCENARIOS = ("fanout", "publish", "catchup", "storm", "dbos")
#: Issue 13's targets.
LATENCY_P50_MS, LATENCY_P99_MS = 15.0, 100.0
PUBLISH_GOAL = 5_000.0
CATCHUP_GOAL = 100_000.0
#: "Independent of the clients": queries/s at the most clients within this factor of the fewest's.
QPS_GROWTH_LIMIT = 1.5
#: The storm's control client counts as served while its p99 stays below this during the storm.
STORM_P99_LIMIT_MS = 1_000.0
#: Relay memory per storm connection above which it would not be "bounded" for 10,000 clients.
STORM_KB_PER_CLIENT_LIMIT = 100.0
#: Seconds after every client is admitted for each to read its (empty) history and join the hub, and
#: the other waits around a load (a storm's lead and hold); less when --seconds is shorter (smoke tests).
SETTLE_S = 2.0
#: pgbench connections writing the fan-out's events (one event per transaction).
WRITER_CONNECTIONS = 8
#: Latency percentiles leave out the load's first second: the relay's ticker, idle before, looks for
#: new commits every ``--idle-poll-interval`` (0.5 s) until it finds some (shown apart as "cold").
WARM_UP_S = 1.0
#: The writers' login role, so that pg_stat_statements tells their statements from the relay's.
WRITER_ROLE = "pgferry_bench_writer"


def q(name: str) -> str:
    return named("streams.sql", name)


def progress(message: str) -> None:
    """Progress to stderr, so stdout holds only the tables."""
    click.echo(message, err=True)


@dataclass(frozen=True)
class StreamsSettings:
    scenarios: tuple[str, ...] = ("fanout", "publish", "catchup", "storm")
    clients: tuple[int, ...] = (10, 100, 1000)
    rate: float = 2000.0
    seconds: float = 20.0
    publish_tasks: int = 16
    catchup_events: int = 1_000_000
    poll_limit: int = 1000
    storm_clients: int = 10_000
    storm_rounds: int = 2
    storm_timeout: float = 300.0
    control_rate: float = 100.0
    dbos_python: Path | None = None

    @property
    def settle(self) -> float:
        """SETTLE_S, or half the load's seconds when that is shorter."""
        return min(SETTLE_S, self.seconds / 2)

    def __post_init__(self) -> None:
        unknown = set(self.scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
        if "dbos" in self.scenarios and self.dbos_python is None:
            raise ValueError("the dbos scenario needs --dbos-python (a Python with the dbos package installed)")


# -- the parties ----------------------------------------------------------------------------------


@dataclass
class Relay:
    proc: asyncio.subprocess.Process
    base: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.asynccontextmanager
async def api_relay(url: str, max_seconds: float) -> AsyncIterator[Relay]:
    """A fresh `pgferry run --api-port P --api-allow-loopback` subprocess, once its API answers."""
    port = free_port()
    args = ["--api-port", str(port), "--api-allow-loopback"]
    async with running_relay(url, max_seconds=max_seconds, args=args) as proc:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(f"{base}/v1/streams/bench-probe/events") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise PgferryError(f"the relay's streams API did not answer at {base}")
                await asyncio.sleep(0.1)
        yield Relay(proc, base)


def read_result(out: Path, returncode: int | None, what: str) -> dict[str, Any]:
    """The JSON a finished child process wrote to its ``--out`` file (a file, not a pipe: a uvloop
    child's multi-megabyte stdout, read by this asyncio process, came back cut at 256 KiB in 2 of 4
    tries, exit status 0)."""
    if returncode != 0 or not out.exists():
        raise PgferryError(f"{what} failed (exit status {returncode})")
    return dict(orjson.loads(out.read_bytes()))


class Clients:
    """A ``bench.sse_client`` subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc = proc
        self.out = out

    async def ready(self, timeout: float) -> dict[str, Any]:
        """The ``ready`` line: every connection admitted or failed."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise PgferryError(f"the clients were not all connected within {timeout:.0f} s") from None
        if not line.startswith(b"ready "):
            raise PgferryError(f"the client process failed (exit status {await self.proc.wait()})")
        return dict(orjson.loads(line[6:]))

    async def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the process to end (every stream ended) and read what it counted."""
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            progress(f"warning: clients still reading {timeout:.0f} s after the streams were closed; stopping them")
            self.proc.terminate()
            await self.proc.wait()
        if not self.out.exists():
            raise PgferryError(f"the client process left no results (exit status {self.proc.returncode})")
        return dict(orjson.loads(self.out.read_bytes()))


@contextlib.asynccontextmanager
async def clients(
    base: str, mode: str, stream: str, count: int = 1, *, timeout: float = 600.0, limit: int = 1000
) -> AsyncIterator[Clients]:
    with tempfile.TemporaryDirectory(prefix="pgferry-bench-clients-") as tmp:
        out = Path(tmp) / "result.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pgferry.bench.streams.sse_client",
            mode,
            "--base",
            base,
            "--stream",
            stream,
            "--count",
            str(count),
            "--timeout",
            str(timeout),
            "--limit",
            str(limit),
            "--out",
            str(out),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            yield Clients(proc, out)
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


# -- what the database did --------------------------------------------------------------------------


@dataclass
class Snapshot:
    at: float
    #: (statement, made by the writers' role) -> (calls, execution ms) so far
    calls: dict[tuple[str, bool], tuple[int, float]]
    xacts: int
    tick: int
    cpu: dict[str, float]


@dataclass
class Window:
    """The load window: queries the relay made, ticks, CPU per party (seconds)."""

    seconds: float
    relay_queries: dict[str, float]  # ticker, reads, other -> calls
    writer_queries: float
    relay_db_ms: float  # the relay's statements' execution time (NaN: not known)
    ticks: int
    cpu: dict[str, float]
    from_statements: bool
    #: the relay's statements by calls over the window, most first
    statements: list[tuple[str, int]] = field(default_factory=list)

    @property
    def relay_qps(self) -> float:
        return sum(self.relay_queries.values()) / self.seconds

    @property
    def relay_db_share(self) -> float:
        """The relay's statements' execution time per second of the window: 100% = one backend busy."""
        return 100 * self.relay_db_ms / 1000 / self.seconds

    def cpu_pct(self, party: str) -> str:
        return f"{100 * self.cpu.get(party, 0.0) / self.seconds:.0f}%" if party in self.cpu else "-"


def _kind(statement: str, writer: bool) -> str:
    """Who asked for a statement: the writer (by its role, or else its text), the bench itself, the
    ticker (and housekeeping), stream reads, or other."""
    if writer or "ferry.publish" in statement:
        return "writer"
    if "ferry.tick_id_seq" in statement:
        return "bench"
    if "ferry._tick" in statement or "ferry.housekeeping" in statement:
        return "ticker"
    if (
        "ferry.batch_events" in statement
        or "ferry._batch_end" in statement
        or "ferry.ticks" in statement
        or "ferry.stream" in statement
        or "ferry.closed_streams" in statement
        or "ferry.partitions" in statement
    ):
        return "reads"
    return "other"


@dataclass
class Bench:
    """The bench database, the server's processes, and what the run found."""

    url: str
    admin: asyncpg.Connection
    postmaster: int | None
    statements: bool
    #: the writers' URL: as WRITER_ROLE when it could be made, else ``url``
    writer_url: str = ""
    writer_role: str | None = None
    admin_url: str = ""
    relay_pid: int | None = None
    client_pid: int | None = None
    targets: list[Target] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    def target(self, section: str, what: str, goal: str, measured: str, met: bool) -> None:
        self.targets.append(Target(section, what, goal, measured, met))

    def _cpu(self) -> dict[str, float]:
        cpu = {"writer": procstat.reaped_cpu_seconds()}
        if self.relay_pid is not None:
            cpu["relay"] = procstat.cpu_seconds(self.relay_pid)
        if self.client_pid is not None:
            cpu["clients"] = procstat.cpu_seconds(self.client_pid)
        if self.postmaster is not None:
            cpu["postgres"] = procstat.tree_cpu_seconds(self.postmaster)
        return cpu

    def cpu_window(self) -> Callable[[], dict[str, float]]:
        """CPU seconds per party from now until the returned function is called (a process started
        meanwhile counts from its start)."""
        before = self._cpu()

        def used() -> dict[str, float]:
            return {party: cpu - before.get(party, 0.0) for party, cpu in self._cpu().items()}

        return used

    async def snapshot(self) -> Snapshot:
        calls: dict[tuple[str, bool], tuple[int, float]] = {}
        if self.statements:
            rows = await self.admin.fetch(q("statement_calls"), BENCH_DATABASE, self.writer_role or "")
            calls = {(r["query"], bool(r["writer"])): (int(r["calls"]), float(r["ms"])) for r in rows}
        xacts = int(await self.admin.fetchval(query("database_xacts"), BENCH_DATABASE) or 0)
        async with connect(self.url) as conn:
            tick = int(await conn.fetchval(query("last_tick_id")) or 0)
        return Snapshot(time.monotonic(), calls, xacts, tick, self._cpu())

    def window(self, before: Snapshot, after: Snapshot, writer_transactions: int) -> Window:
        seconds = after.at - before.at
        cpu = {k: after.cpu[k] - before.cpu.get(k, 0.0) for k in after.cpu}
        if self.statements:
            kinds: dict[str, float] = {"ticker": 0, "reads": 0, "other": 0, "writer": 0, "bench": 0}
            relay: list[tuple[str, int]] = []
            relay_ms = 0.0
            for key, (calls, spent) in after.calls.items():
                statement, by_writer = key
                calls_before, spent_before = before.calls.get(key, (0, 0.0))
                kind, made = _kind(statement, by_writer), calls - calls_before
                kinds[kind] += made
                if kind not in ("writer", "bench") and made:
                    relay.append((statement, made))
                    relay_ms += spent - spent_before
            writer = kinds.pop("writer")
            kinds.pop("bench")
            relay.sort(key=lambda item: -item[1])
            return Window(seconds, kinds, writer, relay_ms, after.tick - before.tick, cpu, True, relay)
        # Without pg_stat_statements: every relay query is its own transaction; the writer's are known.
        other = after.xacts - before.xacts - writer_transactions
        return Window(
            seconds, {"other": max(0, other)}, writer_transactions, float("nan"), after.tick - before.tick, cpu, False
        )


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await db.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def published(url: str, pattern: str) -> dict[str, int]:
    async with connect(url) as conn:
        return {r["stream"]: int(r["n"]) for r in await conn.fetch(q("published_per_stream"), pattern)}


async def close_streams(url: str, streams: list[str]) -> None:
    async with connect(url) as conn:
        await conn.fetchval(q("close_streams"), streams)


def loss(committed: dict[str, int], received: dict[str, int]) -> tuple[int, int]:
    """(events committed in all, events of them never received): a connection receives its stream's
    events in order, so ``received`` counts distinct events (repeats are counted apart)."""
    total = sum(committed.values())
    lost = sum(max(0, n - received.get(stream, 0)) for stream, n in committed.items())
    return total, lost


def latency_of(result: dict[str, Any], since: float = 0.0, until: float = float("inf")) -> Latency:
    """Latencies of the events committed (stamped) from ``since`` until ``until`` (wall clock)."""
    return Latency.of([lat for at, lat in result["latencies"] if since <= at - lat / 1000 < until])


async def writer_role(admin: asyncpg.Connection, url: str) -> tuple[str, str | None]:
    """The writers' URL and role: WRITER_ROLE (made now, a member of ferry_writer) when the server lets
    us make it and log in as it without a password; else the bench's own URL and no role."""
    parts = urlsplit(url)
    candidate = urlunsplit(parts._replace(netloc=f"{WRITER_ROLE}@{parts.netloc.rsplit('@', 1)[-1]}"))
    try:
        await admin.execute(q("create_writer_role"))
        conn = await db.connect(candidate)
        await conn.close()
    except (asyncpg.PostgresError, PgferryError) as exc:
        progress(f"note: writers run as the bench's own role ({exc}); their pool resets count as the relay's")
        return url, None
    return candidate, WRITER_ROLE
