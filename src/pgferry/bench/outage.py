"""`pgferry bench outage`: a receiver down for a minute while events pile up, then back.

Issue 11, defect 10: with a receiver down for 60 s while 20,000 events were
written, 304 s after it came back 3 events were still waiting, because every
parked event followed its own exponential backoff; and while it was down,
every due event cost it a request. Endpoint health (``delivery/health.py``)
is the answer: a down endpoint gets one probe a second, and the first probe
that is answered releases the whole backlog. This benchmark measures both
halves with the subscription's DEFAULT retry settings (defaults must recover
fast, not a tuned subscription): how many requests reach the endpoint while
it is down, how long after it is back the first delivery succeeds, and how
long the backlog then takes to drain (target: 10 s).

Everything is real and out of process: the relay is `pgferry run`
(``bench.relay``), the receiver is ``bench.tracking_receiver`` in its own
process. After a warm-up the receiver goes down in one of three ways:

* ``refuse`` (default): its process is stopped. A stand-in listener in this
  process holds the port and resets (RST) every connection the moment it is
  accepted, counting them: each counts as one request, and the relay sees a
  reset connection (an endpoint-level failure, as a refused one is). When the
  outage ends the stand-in closes and a new receiver process, started ahead
  and waiting, listens on the same port.
* ``503``: the receiver answers every webhook with 503 (no Retry-After).
* ``hang``: the receiver reads requests and never answers (the relay gives up
  after the subscription's timeout, 10 s by default).

Meanwhile ``--events`` events are published at a steady rate over ``--down``
seconds; then the receiver is back. Once a second we note the requests that
reached the endpoint, events delivered (unique), parked (``ferry.retries``)
and dead, until everything is delivered or ``--timeout`` seconds after the
recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import click

from pgferry import db
from pgferry.bench.relay import running_relay
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import named
from pgferry.bench.tracking_receiver import IDS_PATH, MODE_PATH, STATS_PATH
from pgferry.errors import PgferryError

MODES = ("refuse", "503", "hang")
#: Events delivered before the outage (connections open, relay warm); not scored.
WARM_UP_EVENTS = 100
#: Publish rounds per second while the receiver is down.
ROUNDS_PER_SECOND = 10
#: Issue 11: the backlog delivered within this many seconds of the first successful probe.
DRAIN_GOAL_S = 10.0
#: Issue 11: "at most a few requests per second" to a down endpoint, checked on the mean over the outage.
DOWN_RATE_GOAL = 5.0
#: What "requests while down" counts, per mode (printed with the results).
COUNTED = {
    "refuse": "TCP connections to the receiver's port, each accepted and reset at once by a stand-in listener "
    "(the receiver process is stopped; no HTTP is read)",
    "503": "webhook requests the receiver answered with 503",
    "hang": "webhook requests the receiver read and left unanswered",
}
#: SO_LINGER on, timeout 0: close() sends RST.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def _q(name: str) -> str:
    return named("outage.sql", name)


@dataclass(frozen=True)
class OutageSettings:
    events: int = 20_000
    down: int = 60  # seconds
    mode: str = "refuse"
    timeout: float = 120.0  # seconds after the recovery
    every_second: bool = False  # print every second of the timeline, not a condensed one

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.events < 1 or self.down < 1 or self.timeout <= 0:
            raise ValueError("events and down must be at least 1, and timeout positive")


@dataclass(frozen=True)
class Sample:
    """The state at the end of second ``second`` of the outage."""

    second: int
    phase: str  # "down" or "up" during this second
    requests: int  # reaching the endpoint during this second
    requests_total: int
    delivered: int  # outage events delivered so far (unique)
    parked: int
    dead: int


@dataclass
class Result:
    settings: OutageSettings
    samples: list[Sample] = field(default_factory=list)
    committed: int = 0
    down_seconds: float = 0.0
    requests_down: int = 0
    back_gap_ms: float | None = None  # refuse: from the stand-in closing to the receiver listening
    first_ok_s: float | None = None  # from the recovery to the first successful delivery
    drain_s: float | None = None  # from the first successful delivery to the last event delivered
    delivered: int = 0
    duplicates: int = 0
    dead: int = 0
    lost: int = 0
    attempts_down: list[tuple[str, int]] = field(default_factory=list)
    attempts_up: list[tuple[str, int]] = field(default_factory=list)
    most_attempts: int = 0
    retried_events: int = 0

    @property
    def down_rate(self) -> float:
        return self.requests_down / max(1e-9, self.down_seconds)

    @property
    def drain_met(self) -> bool:
        return self.drain_s is not None and self.drain_s <= DRAIN_GOAL_S

    @property
    def rate_met(self) -> bool:
        return self.down_rate <= DOWN_RATE_GOAL

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.dead == 0 and self.drain_met and self.rate_met


class ResetListener:
    """Holds a stopped receiver's port: accepts every connection and resets it at once, counting them.

    Without a listener the kernel refuses connections and nobody can count
    them; this one answers as fast and says how many came."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connections = 0
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.port))
        except OSError as exc:
            sock.close()
            raise PgferryError(f"cannot take over the stopped receiver's port {self.port}: {exc}") from exc
        sock.listen(1024)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(sock)
            self._reset(conn)

    def _reset(self, conn: socket.socket) -> None:
        self.connections += 1
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        conn.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sock is not None:
            while True:  # connections already in the backlog count too
                try:
                    conn, _ = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                self._reset(conn)
            self._sock.close()
            self._sock = None


class ReceiverProcess:
    """``python -m pgferry.bench.tracking_receiver`` in its own process, and a client for its score."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.url = ""
        self.port = 0
        self._base = ""
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    async def spawn(cls, *, port: int = 0, wait_for_go: bool = False) -> ReceiverProcess:
        """Start one; with ``wait_for_go`` it listens (on ``port``) only after ``go()``."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pgferry.bench.tracking_receiver", "--port", str(port),
            *(["--wait-for-go"] if wait_for_go else []),
            stdin=asyncio.subprocess.PIPE if wait_for_go else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        receiver = cls(proc)
        if not wait_for_go:
            await receiver._listening()
        return receiver

    async def _listening(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not line:
            raise PgferryError(f"the receiver process exited (code {await self.proc.wait()}) before listening")
        self.url = line.decode().strip()
        parts = urlsplit(self.url)
        self.port = parts.port or 80
        self._base = f"{parts.scheme}://{parts.netloc}"
        # One kept-alive connection for the score, so asking costs the receiver no new connections.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))

    async def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        await self._listening()

    async def _get(self, path: str) -> Any:
        assert self._session is not None
        async with self._session.get(self._base + path) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def stats(self) -> dict[str, Any]:
        return dict(await self._get(STATS_PATH))

    async def ids(self) -> set[int]:
        return set(await self._get(IDS_PATH))

    async def set_mode(self, mode: str) -> None:
        assert self._session is not None
        async with self._session.get(self._base + MODE_PATH + mode) as resp:
            resp.raise_for_status()

    async def stop(self) -> None:
        """SIGTERM: the process ends and the kernel closes its sockets (the relay's connections see FIN)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.proc.returncode is None:
            self.proc.terminate()
        await self.proc.wait()


class _Publisher:
    """Publishes ``events`` events at a steady rate over ``seconds``, on its own connection; keeps their ids."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[int] = []

    async def run(self, events: int, seconds: float, *, first_seq: int = 0, phase: str = "outage") -> None:
        conn = await db.connect(self.url)
        try:
            rounds = max(1, round(seconds * ROUNDS_PER_SECOND))
            started = time.monotonic()
            seq = first_seq
            for i in range(rounds):
                n = events * (i + 1) // rounds - events * i // rounds
                if n:
                    self.ids.extend(await conn.fetchval(_q("publish"), seq, n, phase))
                    seq += n
                if i + 1 < rounds:  # the last round goes out a round before the end, not at it
                    await asyncio.sleep(max(0.0, started + (i + 1) * seconds / rounds - time.monotonic()))
        finally:
            await conn.close()


class _Outage:
    """The receiver's side of the outage in the chosen mode: take it down, bring it back, count."""

    def __init__(self, mode: str, first: ReceiverProcess) -> None:
        self.mode = mode
        self.first = first
        self.back = first  # the receiver process that answers once the outage ends
        self.listener: ResetListener | None = None
        self.base: dict[str, Any] = {}  # the receiver's score when the outage began
        self.warm_seen: set[int] = set()
        self.requests_down = 0
        self.up_at = 0.0  # time.time() when the endpoint answered again
        self.back_gap_ms: float | None = None

    async def go_down(self) -> None:
        self.warm_seen = await self.first.ids()
        self.base = await self.first.stats()
        if self.mode == "refuse":
            await self.first.stop()
            self.listener = ResetListener(self.first.port)
            await self.listener.start()
            # started now, so that it takes the port over the moment the outage ends
            self.back = await ReceiverProcess.spawn(port=self.first.port, wait_for_go=True)
        else:
            await self.first.set_mode(self.mode)

    async def come_back(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
            self.requests_down = self.listener.connections
            self.listener = None
            closed_at = time.time()
            await self.back.go()
            self.up_at = float((await self.back.stats())["up_at"])
            self.back_gap_ms = (self.up_at - closed_at) * 1000
            return
        await self.back.set_mode("up")
        stats = await self.back.stats()
        self.up_at = float(stats["up_at"])
        self.requests_down = stats["requests_by_mode"][self.mode] - self.base["requests_by_mode"][self.mode]

    async def counts(self) -> tuple[int, int]:
        """(requests that reached the endpoint since the outage began, outage events delivered so far)."""
        if self.listener is not None:
            return self.listener.connections, 0
        stats = await self.back.stats()
        if self.back is not self.first:  # a new process: it saw neither the warm-up nor the outage
            return self.requests_down + stats["requests"], stats["unique"]
        return stats["requests"] - self.base["requests"], stats["unique"] - self.base["unique"]

    async def duplicates(self, seen: set[int]) -> int:
        stats = await self.back.stats()
        if self.back is not self.first:  # warm-up events delivered again count too
            return int(stats["duplicates"]) + len(seen & self.warm_seen)
        return int(stats["duplicates"]) - int(self.base["duplicates"])

    async def close(self) -> None:
        """Stop the stand-in listener and every receiver process."""
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None
        await self.back.stop()
        await self.first.stop()


def _progress(message: str) -> None:
    click.echo(message, err=True)


async def run_outage(url: str, settings: OutageSettings) -> Result:
    """Run the outage against the (scratch) database at ``url``."""
    result = Result(settings)
    conn = await db.connect(url)
    try:
        outage = _Outage(settings.mode, await ReceiverProcess.spawn())
        try:
            await conn.execute(_q("subscribe"), outage.first.url)
            async with running_relay(url, max_seconds=60 + settings.down + settings.timeout + 120):
                await _warm_up(url, outage.first)
                await _run(url, conn, settings, result, outage)
        finally:
            await outage.close()
    finally:
        await conn.close()
    return result


async def _warm_up(url: str, receiver: ReceiverProcess) -> None:
    publisher = _Publisher(url)
    await publisher.run(WARM_UP_EVENTS, 0.5, first_seq=-WARM_UP_EVENTS, phase="warm-up")
    deadline = time.monotonic() + 60
    while (await receiver.stats())["unique"] < WARM_UP_EVENTS:
        if time.monotonic() > deadline:
            raise PgferryError(f"the {WARM_UP_EVENTS} warm-up events were not delivered within 60 s")
        await asyncio.sleep(0.1)


async def _run(
    url: str,
    conn: asyncpg.Connection,
    settings: OutageSettings,
    result: Result,
    outage: _Outage,
) -> None:
    _progress(f"[outage] receiver down ({settings.mode}) for {settings.down} s while {settings.events:,} "
              "events are written")  # fmt: skip
    down_at = datetime.now(UTC)
    await outage.go_down()
    started = time.monotonic()
    publisher = _Publisher(url)
    publishing = asyncio.create_task(publisher.run(settings.events, settings.down))
    recovered_at: float | None = None  # time.monotonic() of the recovery
    up_wall = down_at
    last_total = second = 0
    try:
        while True:
            second += 1
            await asyncio.sleep(max(0.0, started + second - time.monotonic()))
            total, delivered = await outage.counts()
            row = await conn.fetchrow(_q("sample"))
            phase = "down" if recovered_at is None else "up"
            result.samples.append(Sample(second, phase, total - last_total, total, delivered, row["parked"],
                                         row["dead"]))  # fmt: skip
            last_total = total
            if recovered_at is None:
                if second < settings.down or not publishing.done():
                    if second % 10 == 0:
                        _progress(f"[{second:4d} s] down: {total:,} requests so far, {row['parked']:,} parked")
                    continue
                publishing.result()  # the load failed: say why
                result.committed = len(publisher.ids)
                result.down_seconds = time.monotonic() - started
                await outage.come_back()
                recovered_at = time.monotonic()
                up_wall = datetime.now(UTC)
                _progress(f"[{second:4d} s] receiver back; {outage.requests_down:,} requests reached it while "
                          f"down; {row['parked']:,} events parked")  # fmt: skip
                continue
            if delivered + row["dead"] >= result.committed and await _settled(conn, outage.back, publisher.ids):
                break
            if time.monotonic() - recovered_at > settings.timeout:
                _progress(f"[{second:4d} s] gave up waiting {settings.timeout:g} s after the recovery")
                break
            if second % 5 == 0:
                _progress(f"[{second:4d} s] up: {delivered:,} of {result.committed:,} delivered")
    finally:
        if not publishing.done():
            publishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publishing
    await _score(conn, result, outage, publisher.ids, down_at, up_wall)


async def _settled(conn: asyncpg.Connection, receiver: ReceiverProcess, ids: list[int]) -> bool:
    """Every published event delivered or dead."""
    dead = {r["event_id"] for r in await conn.fetch(_q("dead_ids"))}
    return not set(ids) - await receiver.ids() - dead


async def _score(
    conn: asyncpg.Connection, result: Result, outage: _Outage, ids: list[int], down_at: datetime, up_wall: datetime
) -> None:
    expected = set(ids)
    seen = await outage.back.ids()
    stats = await outage.back.stats()
    dead = {r["event_id"] for r in await conn.fetch(_q("dead_ids"))}
    result.committed = len(expected)
    result.requests_down = outage.requests_down
    result.back_gap_ms = outage.back_gap_ms
    result.delivered = len(expected & seen)
    result.dead = len(expected & dead)
    result.lost = len(expected - seen - dead)
    result.duplicates = await outage.duplicates(seen)
    if stats["first_ok_at"] is not None and outage.up_at:
        result.first_ok_s = float(stats["first_ok_at"]) - outage.up_at
        if result.lost == 0 and stats["last_new_at"] is not None:
            result.drain_s = max(0.0, float(stats["last_new_at"]) - float(stats["first_ok_at"]))
    now, outage_ids = datetime.now(UTC), sorted(expected)
    for into, since, until in ((result.attempts_down, down_at, up_wall), (result.attempts_up, up_wall, now)):
        into.extend((r["outcome"], r["n"]) for r in await conn.fetch(_q("attempts_by_class"), since, until, outage_ids))
    row = await conn.fetchrow(_q("attempts_per_event"), outage_ids)
    result.most_attempts, result.retried_events = row["most"], row["retried"]


def _condensed(samples: list[Sample], committed: int, down: int) -> list[Sample]:
    """Every second from just before the recovery until just after the drain, and every second
    with more requests than the goal while down; otherwise every 5th (longer outages: every ~12th of it)."""
    if not samples:
        return []
    up = next((s.second for s in samples if s.phase == "up"), samples[-1].second)
    drained = next((s.second for s in samples if s.phase == "up" and s.delivered + s.dead >= committed),
                   samples[-1].second)  # fmt: skip
    step = max(5, 5 * round(down / 60))
    return [
        s for s in samples
        if s.second <= 3 or up - 3 <= s.second <= drained + 2 or s.second % step == 0 or s is samples[-1]
        or (s.phase == "down" and s.requests > DOWN_RATE_GOAL)
    ]  # fmt: skip


def print_result(result: Result) -> None:
    s = result.settings
    shown = result.samples if s.every_second else _condensed(result.samples, result.committed, s.down)
    click.echo(
        f"outage: receiver down ({s.mode}) for {s.down} s while {s.events:,} events were published at a steady "
        f"rate; subscription with default settings; relay `pgferry run`, receiver in its own process"
    )
    rows = [
        [str(x.second), x.phase, num(x.requests), num(x.requests_total), num(x.delivered), num(x.parked), num(x.dead)]
        for x in shown
    ]
    click.echo(table(["s", "phase", "requests", "requests total", "delivered", "parked", "dead"], rows))
    if not s.every_second:
        click.echo("(condensed: every second around the recovery and the drain and with more than "
                   f"{DOWN_RATE_GOAL:g} requests while down, a sample every few seconds otherwise; "
                   "--every-second for all)")  # fmt: skip
    per_second = [x.requests for x in result.samples if x.phase == "down"]
    busiest = max(per_second, default=0)
    click.echo(f"requests while down count {COUNTED[s.mode]}.")
    click.echo(
        f"requests to the endpoint while down: {result.requests_down:,} in {result.down_seconds:.1f} s = "
        f"{result.down_rate:.2f}/s on average (goal <= {DOWN_RATE_GOAL:g}/s: {_verdict(result.rate_met)}); "
        f"at most {busiest} in one second"
    )
    if result.back_gap_ms is not None:
        click.echo(f"  the port refused connections for {result.back_gap_ms:.0f} ms between the stand-in closing "
                   "and the new receiver listening (uncounted)")  # fmt: skip
    click.echo(f"recovery -> first successful delivery (the first successful probe): {_seconds(result.first_ok_s)}")
    click.echo(
        f"first successful probe -> last event delivered (the drain): {_seconds(result.drain_s)} "
        f"(goal <= {DRAIN_GOAL_S:g} s: {_verdict(result.drain_met)})"
    )
    click.echo(
        f"events: committed {result.committed:,}, delivered {result.delivered:,}, duplicates {result.duplicates:,}, "
        f"dead {result.dead:,} (must be 0), lost {result.lost:,} (must be 0)"
    )
    click.echo(f"relay's attempts recorded while down: {_outcomes(result.attempts_down)}; "
               f"after: {_outcomes(result.attempts_up)}")  # fmt: skip
    click.echo(f"attempts per event: at most {result.most_attempts}; events sent more than once: "
               f"{result.retried_events:,} (held events spend no attempt)")  # fmt: skip


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _outcomes(rows: list[tuple[str, int]]) -> str:
    return ", ".join(f"{outcome} {n:,}" for outcome, n in rows) or "none"
