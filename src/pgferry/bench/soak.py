"""`pgferry bench soak`: moderate load against a flaky receiver for many minutes, watching for drift.

Short tests prove a fault is survived once; a soak shows what only time
reveals: memory that grows with every retry, connections that pile up, lag
that creeps, a log or attempt history that retention does not keep flat. The
relay runs as `pgferry run` in its own process (so its RSS and sockets are its
own); the receiver fails a few percent of requests in every way the fault
tests use (5xx, Retry-After, dropped connections, garbage, cut bodies,
hangs) and always rejects one event in a thousand (those must end in dead
letters). At the end the load stops, the backlog drains and everything is
counted: nothing committed may be missing.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field

import click
import orjson

from pgferry import db
from pgferry.bench.relay import running_relay
from pgferry.bench.report import num, percentile, table
from pgferry.bench.sqlfiles import named
from pgferry.receiver import Action, CutBody, Drop, Garbage, Hang, Received, Receiver, Respond

POISON_EVERY = 1000  # seq % POISON_EVERY == POISON_EVERY - 1 is always refused


def _q(name: str) -> str:
    return named("soak.sql", name)


@dataclass
class SoakSettings:
    minutes: float = 20.0
    rate: float = 200.0  # events/s
    sample_every: float = 60.0
    failure_rate: float = 0.07  # share of requests the receiver fails (besides poison events)
    timeout_ms: int = 2000
    max_attempts: int = 8
    rotation_interval: str = "1 minute"
    attempts_retention: str = "2 minutes"
    drain_timeout: float = 180.0
    seed: int = 1


@dataclass
class FlakyReceiver:
    """Decides each request's fate and keeps what the count needs (no request bodies)."""

    failure_rate: float
    rng: random.Random
    first: set[int] = field(default_factory=set)  # seqs answered 2xx at least once
    msg_ids: dict[int, str] = field(default_factory=dict)
    duplicates: int = 0
    inconsistent_ids: int = 0  # a seq that came under two webhook-ids (must stay 0)
    latencies_ms: list[float] = field(default_factory=list)  # first deliveries since the last sample
    failures: dict[str, int] = field(default_factory=dict)

    def __call__(self, request: Received) -> Action:  # noqa: PLR0911 - one return per fate
        body = orjson.loads(request.body)
        seq = int(body["seq"])
        if seq % POISON_EVERY == POISON_EVERY - 1:
            return self._fail("poison", Respond(500, b"poison event"))
        r = self.rng.random()
        if r < self.failure_rate:
            share = r / self.failure_rate
            if share < 0.45:
                return self._fail("500", Respond(500, b"flaky"))
            if share < 0.6:
                return self._fail("503+retry-after", Respond(503, b"busy", (("retry-after", "1"),)))
            if share < 0.75:
                return self._fail("drop", Drop())
            if share < 0.85:
                return self._fail("garbage", Garbage())
            if share < 0.95:
                return self._fail("cut body", CutBody())
            return self._fail("hang", Hang())
        msg_id = request.headers.get("webhook-id", "")
        if seq in self.first:
            self.duplicates += 1
            if self.msg_ids.get(seq) != msg_id:
                self.inconsistent_ids += 1
        else:
            self.first.add(seq)
            self.msg_ids[seq] = msg_id
            self.latencies_ms.append((request.at - float(body["t"])) * 1000)
        return Respond()

    def _fail(self, kind: str, action: Action) -> Action:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        return action


@dataclass
class Sample:
    elapsed_s: float
    published: int
    delivered: int
    dead: int
    parked: int
    cursor_age_s: float
    p50_ms: float
    p99_ms: float
    relay_rss_mb: float
    relay_cpu_pct: float
    relay_sockets: int
    relay_sessions: int
    receiver_conns: int
    attempt_rows: int
    db_mb: float


def _proc_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _proc_sockets(pid: int) -> int:
    count = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    count += 1
            except OSError:
                continue
    except OSError:
        return -1
    return count


class _Load:
    """Publishes ``rate`` events/s in rounds of 100 ms on one connection; remembers what committed."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = url
        self.per_round = max(1, round(rate / 10))
        self.committed: list[range] = []
        self.failed = 0
        self.stop = asyncio.Event()

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.committed)

    async def run(self) -> None:
        conn = await db.connect(self.url)
        seq = 0
        next_round = time.monotonic()
        try:
            while not self.stop.is_set():
                batch = range(seq, seq + self.per_round)
                seq += self.per_round
                try:
                    await conn.fetchval(_q("publish"), batch.start, batch.stop - 1)
                    self.committed.append(batch)
                except db.CONNECTION_ERRORS:
                    self.failed += 1
                    conn.terminate()
                    conn = await db.connect(self.url)
                next_round += 0.1
                await asyncio.sleep(max(0.0, next_round - time.monotonic()))
        finally:
            conn.terminate()


async def run_soak(url: str, settings: SoakSettings) -> bool:
    """Run the soak against the (scratch) database at ``url``; print the table; True if nothing was lost."""
    flaky = FlakyReceiver(settings.failure_rate, random.Random(settings.seed))
    receiver = Receiver(flaky, keep=False)
    hook_url = await receiver.start()
    conn = await db.connect(url)
    samples: list[Sample] = []
    load = _Load(url, settings.rate)
    duration = settings.minutes * 60
    try:
        await conn.execute(_q("configure"), settings.rotation_interval, settings.attempts_retention)
        await conn.execute(_q("subscribe"), hook_url, settings.timeout_ms, settings.max_attempts)
        budget = duration + settings.drain_timeout + 120
        async with running_relay(url, max_seconds=budget) as proc:
            started = time.monotonic()
            last_cpu, last_at = _proc_cpu_s(proc.pid), started

            async def sample() -> None:
                nonlocal last_cpu, last_at
                row = await conn.fetchrow(_q("sample"))
                now, cpu = time.monotonic(), _proc_cpu_s(proc.pid)
                lat, flaky.latencies_ms = sorted(flaky.latencies_ms), []
                samples.append(
                    Sample(
                        elapsed_s=now - started,
                        published=load.count,
                        delivered=len(flaky.first),
                        dead=row["dead"],
                        parked=row["parked"],
                        cursor_age_s=float(row["cursor_age_s"] or 0.0),
                        p50_ms=percentile(lat, 50),
                        p99_ms=percentile(lat, 99),
                        relay_rss_mb=_proc_rss_mb(proc.pid),
                        relay_cpu_pct=100 * (cpu - last_cpu) / max(1e-9, now - last_at),
                        relay_sockets=_proc_sockets(proc.pid),
                        relay_sessions=row["relay_sessions"],
                        receiver_conns=len(receiver.stats.open),
                        attempt_rows=row["attempt_rows"],
                        db_mb=row["db_bytes"] / 2**20,
                    )
                )
                last_cpu, last_at = cpu, now
                s = samples[-1]
                click.echo(
                    f"[{s.elapsed_s / 60:5.1f} min] published {s.published:,} delivered {s.delivered:,} "
                    f"dead {s.dead} parked {s.parked} rss {s.relay_rss_mb:.1f} MB db {s.db_mb:.1f} MB",
                    err=True,
                )

            await sample()
            publisher = asyncio.create_task(load.run())
            try:
                while time.monotonic() - started < duration:
                    await asyncio.sleep(min(settings.sample_every, duration - (time.monotonic() - started)))
                    if publisher.done():
                        publisher.result()  # the load died: say why
                    await sample()
            finally:
                load.stop.set()
                await publisher
            # Drain: every committed event delivered or dead-lettered.
            deadline = time.monotonic() + settings.drain_timeout
            expected = {n for r in load.committed for n in r}
            while True:
                dead = {r["seq"] for r in await conn.fetch(_q("dead_seqs"))}
                missing = expected - flaky.first - dead
                if not missing or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            await sample()
    finally:
        await conn.close()
        await receiver.stop()
    _print(samples, settings, flaky, load, missing, dead, receiver)
    return not missing and flaky.inconsistent_ids == 0


def _print(
    samples: list[Sample],
    settings: SoakSettings,
    flaky: FlakyReceiver,
    load: _Load,
    missing: set[int],
    dead: set[int],
    receiver: Receiver,
) -> None:
    headers = ["min", "published", "delivered", "dead", "parked", "lag s", "p50 ms", "p99 ms", "relay RSS MB",
               "relay CPU", "relay sockets", "relay sessions", "receiver conns", "attempt rows", "db MB"]  # fmt: skip
    rows = [
        [f"{s.elapsed_s / 60:.1f}", num(s.published), num(s.delivered), num(s.dead), num(s.parked),
         f"{s.cursor_age_s:.1f}", num(s.p50_ms), num(s.p99_ms), f"{s.relay_rss_mb:.1f}", f"{s.relay_cpu_pct:.0f}%",
         str(s.relay_sockets), str(s.relay_sessions), str(s.receiver_conns), num(s.attempt_rows), f"{s.db_mb:.1f}"]
        for s in samples
    ]  # fmt: skip
    click.echo(
        f"soak: {settings.minutes:g} min at {settings.rate:g} events/s, receiver failing "
        f"{settings.failure_rate:.0%} of requests + 1 event in {POISON_EVERY} always; latency = publish to first "
        "2xx (retries included); "
        f"rotation every {settings.rotation_interval}, attempts kept {settings.attempts_retention}"
    )
    click.echo(table(headers, rows))
    # After warm-up (pools filled, first rotations, attempt history at its retained size):
    # the sample nearest a quarter of the run, and at least two minutes in.
    warm = max(120.0, samples[-1].elapsed_s / 4)
    steady = min(samples, key=lambda s: abs(s.elapsed_s - warm))
    points = (samples[0], steady, samples[-1])
    click.echo(
        table(
            ["gauge", "start", "after warm-up", "end"],
            [
                ["relay RSS MB", *(f"{s.relay_rss_mb:.1f}" for s in points)],
                ["relay sockets", *(str(s.relay_sockets) for s in points)],
                ["relay sessions", *(str(s.relay_sessions) for s in points)],
                ["db MB", *(f"{s.db_mb:.1f}" for s in points)],
                ["max lag s", "-", "-", f"{max(s.cursor_age_s for s in samples):.1f}"],
            ],
        )
    )
    failures = ", ".join(f"{k} {v:,}" for k, v in sorted(flaky.failures.items()))
    click.echo(
        f"committed {load.count:,} (publish failures {load.failed}), delivered {len(flaky.first):,}, "
        f"dead {len(dead):,} (poison {sum(1 for s in dead if s % POISON_EVERY == POISON_EVERY - 1):,}), "
        f"lost {len(missing):,}, duplicates {flaky.duplicates:,} (under another webhook-id: {flaky.inconsistent_ids}); "
        f"requests {receiver.stats.requests:,}, connections opened {receiver.stats.connections:,}; "
        f"failures injected: {failures}"
    )
