"""`pgferry bench http`: the CPU one webhook POST costs the sending process, per HTTP client, side by side.

Why: on a two-core machine that also runs PostgreSQL, the relay's CPU per
request decides whether deliveries keep up with inserts (docs/benchmarks.md,
"The HTTP client decides this benchmark"). The sender's response parsing
moved from httptools (llhttp, C) to the pure-Python ``delivery.http1`` for
correctness, and it must stay within 10% of the previous sender in requests
per CPU second. This machine's absolute rates drift about 2x from day to
day while ratios hold, so the clients are measured in one run, interleaved.

What: a receiver (``pgferry.receiver``, answering 200 with a small JSON body
on kept-alive connections) runs in its own process on 127.0.0.1, pinned to
the other cores, so the client's CPU is measured alone. Each client runs in
a fresh subprocess pinned to one core, on uvloop: a warm-up (connections
opened, code paths imported), then N POSTs of a ~300-byte JSON body with
Standard Webhooks headers (real signatures, computed before the clock
starts), with K in flight from K tasks. Measured: wall time and the
process's CPU time (``time.process_time``: every thread, user and system).
Each client runs ``rounds`` times interleaved (A B C A B C ...); the table
gives medians. A client must get 200 for every request and the receiver
must have counted every one, else its row says so and the exit status is 1.

The CPU figure includes the bench's own loop (a task taking the next
request, a counter), the same for every client, so ratios understate the
clients' own differences slightly.

Run as ``python -m pgferry.bench.http serve|client ...`` it is one of those
subprocesses; `pgferry bench http` (``run_http_bench``) drives them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from pgferry.bench.report import num, table

#: Every client the bench knows, in the order rows are printed and runs are interleaved.
CLIENTS = ("pgferry", "previous", "pgferry-capture", "aiohttp", "httpx", "pyreqwest")
#: What each client is, for the table's legend.
DESCRIPTIONS = {
    "pgferry": "FastSender.send (delivery/fasthttp.py + delivery/http1.py): the webhook path",
    "previous": "FastSender.send of the module given with --compare-module",
    "pgferry-capture": "FastSender.request(..., capture=True): the pg_net API's path (all headers, whole body)",
    "aiohttp": "aiohttp ClientSession, TCPConnector(limit=K), body read",
    "httpx": "httpx AsyncClient, Limits(max_connections=K), body read",
    "pyreqwest": "pyreqwest Client, max_connections(K), body read",
}
#: Bench-only clients: measured when their package is installed, never a pgferry dependency.
OPTIONAL = ("httpx", "pyreqwest")
#: pgferry's sender must keep this share of the previous one's requests per CPU second.
TARGET_SHARE = 0.90
TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
COUNTS_PATH = "/__counts"
RESPONSE_BODY = b'{"ok":true}'
_SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass(frozen=True)
class HttpBenchSettings:
    requests: int = 20_000
    in_flight: int = 64
    rounds: int = 3
    #: requests sent (and not measured) before each measured run
    warm_up: int = 1_000
    clients: tuple[str, ...] = CLIENTS
    compare_module: Path | None = None
    #: the core each client is pinned to (default: the highest one this process may use)
    cpu: int | None = None

    def __post_init__(self) -> None:
        if self.requests < 1 or self.in_flight < 1 or self.rounds < 1 or self.warm_up < 0:
            raise ValueError("requests, in_flight and rounds must be positive, warm_up not negative")
        unknown = set(self.clients) - set(CLIENTS)
        if unknown:
            raise ValueError(f"unknown client(s) {', '.join(sorted(unknown))}; choose from {', '.join(CLIENTS)}")
        if self.compare_module is not None and not self.compare_module.is_file():
            raise ValueError(f"--compare-module {self.compare_module}: no such file")


@dataclass
class Run:
    """One client's measured run (one round)."""

    client: str
    requests: int
    ok: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # "200", "503", "TimeoutError: ..." -> count
    wall_s: float = 0.0
    cpu_s: float = 0.0
    received: int = -1  # as counted by the receiver, warm-up excluded; -1: unknown
    failure: str | None = None  # the subprocess itself failed

    @property
    def correct(self) -> bool:
        return self.failure is None and self.ok == self.requests and self.received == self.requests

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.requests * 1e6

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0


# -- the request every client sends ---------------------------------------------------------------


def requests_to_send(count: int, first_id: int) -> list[tuple[bytes, dict[str, str]]]:
    """``count`` webhook requests: a ~300-byte event envelope each, signed as pgferry signs them."""
    from pgferry.delivery.signing import Signer

    signer = Signer([_SECRET])
    timestamp = int(time.time())
    out = []
    for event_id in range(first_id, first_id + count):
        body = json.dumps(
            {
                "type": "INSERT",
                "table": "orders",
                "schema": "public",
                "record": {
                    "id": event_id,
                    "customer_id": 7340 + event_id % 97,
                    "status": "paid",
                    "amount": "149.90",
                    "currency": "EUR",
                    "note": "express delivery, leave the parcel at the back door, ring twice",
                    "shipping": "DHL Express",
                    "created_at": "2026-11-30T12:34:56.789012+00:00",
                },
                "old_record": None,
            },
            separators=(",", ":"),
        ).encode()
        msg_id = f"evt_{event_id}"
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signer.sign(msg_id, timestamp, body),
        }
        out.append((body, headers))
    return out


# -- clients (each in its own subprocess) ---------------------------------------------------------

#: ``send(body, headers)`` -> the status code as text
Send = Callable[[bytes, dict[str, str]], Awaitable[str]]
Close = Callable[[], Awaitable[None]]


def load_module(path: Path) -> ModuleType:
    """A Python module from a file (the sender to compare with), under a name of its own."""
    name = "pgferry_bench_compare_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise click.ClickException(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _fast_sender(sender: Any, url: str, capture: bool) -> tuple[Send, Close]:
    async def send(body: bytes, headers: dict[str, str]) -> str:
        if capture:
            result = await sender.request("POST", url, body, headers, timeout=TIMEOUT_S,
                                          connect_timeout=CONNECT_TIMEOUT_S, capture=True)  # fmt: skip
        else:
            result = await sender.send(url, body, headers, timeout=TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S)
        if result.status is None:
            return f"{result.error_class}: {result.error}"
        return str(result.status)

    async def close() -> None:
        await sender.close()

    return send, close


async def make_client(name: str, url: str, in_flight: int, module: Path | None) -> tuple[Send, Close]:
    """The client called ``name``, set up to send to ``url`` with ``in_flight`` connections."""
    if name in ("pgferry", "pgferry-capture"):
        from pgferry.delivery.fasthttp import FastSender

        return _fast_sender(FastSender(pool_size=in_flight), url, capture=name == "pgferry-capture")
    if name == "previous":
        assert module is not None
        return _fast_sender(load_module(module).FastSender(pool_size=in_flight), url, capture=False)
    if name == "aiohttp":
        return _aiohttp(url, in_flight)
    if name == "httpx":
        return _httpx(url, in_flight)
    if name == "pyreqwest":
        return _pyreqwest(url, in_flight)
    raise ValueError(f"unknown client {name!r}")


def _aiohttp(url: str, in_flight: int) -> tuple[Send, Close]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=in_flight),
        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
    )

    async def send(body: bytes, headers: dict[str, str]) -> str:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            return str(response.status)

    return send, session.close


def _httpx(url: str, in_flight: int) -> tuple[Send, Close]:
    import httpx

    client = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight),
        timeout=httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
    )

    async def send(body: bytes, headers: dict[str, str]) -> str:
        response = await client.post(url, content=body, headers=headers)  # reads the whole body
        return str(response.status_code)

    return send, client.aclose


def _pyreqwest(url: str, in_flight: int) -> tuple[Send, Close]:
    from datetime import timedelta

    from pyreqwest.client import ClientBuilder

    client = (
        ClientBuilder()
        .max_connections(in_flight)
        .timeout(timedelta(seconds=TIMEOUT_S))
        .connect_timeout(timedelta(seconds=CONNECT_TIMEOUT_S))
        .build()
    )

    async def send(body: bytes, headers: dict[str, str]) -> str:
        response = await client.post(url).headers(headers).body_bytes(body).build().send()
        await response.bytes()
        return str(response.status)

    return send, client.close


async def drive(send: Send, requests: list[tuple[bytes, dict[str, str]]], in_flight: int) -> Counter[str]:
    """Send every request, ``in_flight`` at a time; how each ended."""
    outcomes: Counter[str] = Counter()
    pending = iter(requests)

    async def lane() -> None:
        for body, headers in pending:
            try:
                outcome = await send(body, headers)
            except Exception as exc:  # noqa: BLE001 - a failed request is a result here, not a bench error
                outcome = f"{type(exc).__name__}: {exc}"[:200]
            outcomes[outcome] += 1

    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return outcomes


async def measure(name: str, url: str, count: int, in_flight: int, warm_up: int, module: Path | None) -> Run:
    """Warm up, then send ``count`` requests and take the wall and CPU time they cost this process."""
    send, close = await make_client(name, url, in_flight, module)
    try:
        await drive(send, requests_to_send(warm_up, 1), in_flight)
        work = requests_to_send(count, warm_up + 1)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        outcomes = await drive(send, work, in_flight)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await close()
    return Run(name, count, outcomes["200"], dict(outcomes), wall, cpu)


# -- the receiver (its own subprocess) ------------------------------------------------------------


async def serve() -> None:
    """Answer 200 with a small JSON body to every POST; count them by path; GET COUNTS_PATH tells."""
    from pgferry.receiver import Action, Received, Receiver, Respond

    counts: Counter[str] = Counter()
    answer = Respond(200, RESPONSE_BODY, (("content-type", "application/json"),))

    def behaviour(request: Received) -> Action:
        if request.path == COUNTS_PATH:
            return Respond(200, json.dumps(counts).encode())
        counts[request.path] += 1
        return answer

    receiver = Receiver(behaviour, keep=False)
    print(await receiver.start(path="/"), flush=True)
    await asyncio.Event().wait()  # until the bench terminates this process


def _worker_main(argv: list[str]) -> None:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m pgferry.bench.http")
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("serve")
    server.add_argument("--cpus", default="")
    client = commands.add_parser("client")
    client.add_argument("--client", required=True, choices=CLIENTS)
    client.add_argument("--url", required=True)
    client.add_argument("--requests", type=int, required=True)
    client.add_argument("--in-flight", type=int, required=True)
    client.add_argument("--warm-up", type=int, required=True)
    client.add_argument("--cpu", type=int, required=True)
    client.add_argument("--module", type=Path)
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(serve())
        return
    os.sched_setaffinity(0, {args.cpu})
    run = uvloop.run(measure(args.client, args.url, args.requests, args.in_flight, args.warm_up, args.module))
    print(json.dumps(asdict(run)), flush=True)


# -- the driver (`pgferry bench http`) ------------------------------------------------------------


def _progress(message: str) -> None:
    click.echo(message, err=True)


@contextlib.contextmanager
def receiver_process(cpus: set[int]) -> Iterator[str]:
    """A receiver subprocess pinned to ``cpus``; yields its base URL (``http://127.0.0.1:PORT/``)."""
    command = [sys.executable, "-m", "pgferry.bench.http", "serve", "--cpus", ",".join(map(str, sorted(cpus)))]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise click.ClickException(f"the receiver did not start (exit status {proc.wait(10)})")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def received(base_url: str) -> Counter[str]:
    """Requests the receiver answered, by path."""
    with urllib.request.urlopen(base_url.rstrip("/") + COUNTS_PATH, timeout=10) as response:
        return Counter(json.loads(response.read()))


def run_client(settings: HttpBenchSettings, name: str, base_url: str, cpu: int, tag: str) -> Run:
    """One measured run of ``name`` in a fresh subprocess; the receiver's count checked."""
    path = f"/hook/{name}/{tag}"
    command = [
        sys.executable, "-m", "pgferry.bench.http", "client", "--client", name, "--url", base_url.rstrip("/") + path,
        "--requests", str(settings.requests), "--in-flight", str(settings.in_flight),
        "--warm-up", str(settings.warm_up), "--cpu", str(cpu),
    ]  # fmt: skip
    if name == "previous":
        assert settings.compare_module is not None
        command += ["--module", str(settings.compare_module)]
    # Generous: even a client at 1,000 requests/s finishes well within it.
    timeout = 120 + (settings.requests + settings.warm_up) / 500
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Run(name, settings.requests, failure=f"did not finish within {timeout:.0f} s")
    if done.returncode != 0 or not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Run(name, settings.requests, failure=f"exit status {done.returncode}: {tail}")
    run = Run(**json.loads(done.stdout.strip().splitlines()[-1]))
    run.received = received(base_url)[path] - settings.warm_up
    return run


def available(settings: HttpBenchSettings) -> list[str]:
    """The clients that can run here; a note on stderr for each one skipped."""
    chosen = []
    for name in CLIENTS:
        if name not in settings.clients:
            continue
        if name == "previous" and settings.compare_module is None:
            _progress("previous: skipped (give --compare-module PATH to measure an earlier fasthttp.py)")
            continue
        if name in OPTIONAL and importlib.util.find_spec(name) is None:
            _progress(f"{name}: skipped, not installed (bench only: `.venv/bin/pip install {name}` to measure it)")
            continue
        chosen.append(name)
    return chosen


def pinning(cpu: int | None) -> tuple[int, set[int]]:
    """(the clients' core, the receiver's cores): the receiver gets every other allowed core."""
    allowed = os.sched_getaffinity(0)
    client = max(allowed) if cpu is None else cpu
    if client not in allowed:
        raise click.BadParameter(
            f"core {client} is not among this process's cores {sorted(allowed)}", param_hint="--cpu"
        )
    return client, (allowed - {client}) or {client}


def run_http_bench(settings: HttpBenchSettings, json_out: Path | None = None) -> bool:
    """Run every client ``rounds`` times, interleaved; print the table; False if a client failed or
    pgferry's sender missed its target against the compared module."""
    clients = available(settings)
    cpu, receiver_cpus = pinning(settings.cpu)
    started = datetime.now(UTC)
    load = os.getloadavg()
    runs: dict[str, list[Run]] = {name: [] for name in clients}
    with receiver_process(receiver_cpus) as base_url:
        for round_no in range(1, settings.rounds + 1):
            for name in clients:
                _progress(f"[http] round {round_no}/{settings.rounds}: {name} ...")
                run = run_client(settings, name, base_url, cpu, str(round_no))
                runs[name].append(run)
                _progress(f"[http]   {run.rate:,.0f} req/s, {run.cpu_us:.1f} µs CPU/req, "
                          f"{run.ok:,}/{run.requests:,} answered 200, {run.received:,} counted by the receiver"
                          + (f"; FAILED: {run.failure}" if run.failure else ""))  # fmt: skip
    end_load = os.getloadavg()
    click.echo(
        f"HTTP clients: {settings.requests:,} POSTs of ~300 B each (after {settings.warm_up:,} warm-up), "
        f"{settings.in_flight} in flight, uvloop, client pinned to core {cpu}, receiver (own process) on "
        f"core(s) {','.join(map(str, sorted(receiver_cpus)))}; {settings.rounds} round(s) interleaved, medians; "
        f"{started:%Y-%m-%d %H:%M} UTC, load average {load[0]:.2f} before, {end_load[0]:.2f} after"
    )
    for name in clients:
        extra = f" ({settings.compare_module})" if name == "previous" else ""
        click.echo(f"   {name:<16} {DESCRIPTIONS[name]}{extra}")
    ok, rows = report(runs)
    click.echo(rows)
    met = verdict(runs)
    if json_out is not None:
        raw = {name: [asdict(r) for r in rs] for name, rs in runs.items()}
        json_out.write_text(json.dumps({"settings": str(settings), "started": started.isoformat(), "runs": raw}))
    return ok and met


def _median(runs: list[Run], value: Callable[[Run], float]) -> float:
    return statistics.median(value(r) for r in runs)


def report(runs: dict[str, list[Run]]) -> tuple[bool, str]:
    """The table, and whether every client got 200 for every request."""
    base = runs.get("pgferry")
    base_cpu = _median(base, lambda r: r.cpu_us) if base and all(r.failure is None for r in base) else None
    rows = []
    notes = []
    all_ok = True
    for name, client_runs in runs.items():
        total = sum(r.requests for r in client_runs)
        good = [r for r in client_runs if r.failure is None]
        ok_share = 100.0 * sum(r.ok for r in good) / total if total else 0.0
        correct = all(r.correct for r in client_runs)
        all_ok = all_ok and correct
        if not good:
            rows.append([name, num(total), "FAILED", "-", "-", "-", "-", "-"])
        else:
            cpu = _median(good, lambda r: r.cpu_us)
            spread = f"{min(r.cpu_us for r in good):.1f}-{max(r.cpu_us for r in good):.1f}"
            rows.append([
                name, num(total), f"{ok_share:.2f}%" if correct else f"{ok_share:.2f}% WRONG",
                f"{_median(good, lambda r: r.wall_s):.2f}", num(_median(good, lambda r: r.rate)),
                f"{cpu:.1f}", spread, f"{base_cpu / cpu:.2f}x" if base_cpu else "-",
            ])  # fmt: skip
        for r in client_runs:
            if not r.correct:
                other = {k: v for k, v in r.outcomes.items() if k != "200"}
                failure = f"{r.failure}; " if r.failure else ""
                notes.append(f"   {name}: {failure}{r.ok:,}/{r.requests:,} got 200, receiver counted "
                             f"{r.received:,}; other outcomes: {other or 'none'}")  # fmt: skip
    headers = ["client", "requests", "200 OK", "wall s", "req/s", "CPU µs/req", "CPU µs range", "req/CPU-s vs pgferry"]
    text = table(headers, rows)
    text += (
        "\n   requests: all rounds; 200 OK: share answered 200 (WRONG: not every request, or the receiver counted "
        "otherwise); wall s, req/s, CPU µs/req: medians of the rounds (CPU: the client process's user + system "
        "time over the measured requests); range: lowest-highest CPU µs/req of the rounds; "
        "req/CPU-s vs pgferry: requests per CPU second relative to pgferry's current sender (> 1: cheaper)"
    )
    if notes:
        text += "\n" + "\n".join(notes)
    return all_ok, text


def verdict(runs: dict[str, list[Run]]) -> bool:
    """Print pgferry's sender against the compared one (per round and medians); whether the target is met."""
    current, previous = runs.get("pgferry"), runs.get("previous")
    if not current or not previous or any(r.failure for r in current + previous):
        return True
    share = _median(previous, lambda r: r.cpu_us) / _median(current, lambda r: r.cpu_us)
    per_round = [p.cpu_us / c.cpu_us for c, p in zip(current, previous, strict=True)]
    met = share >= TARGET_SHARE
    click.echo(
        f"\n   pgferry's sender vs previous, requests per CPU second: {100 * share:.1f}% "
        f"(per round {', '.join(f'{100 * s:.1f}%' for s in per_round)}); "
        f"target >= {100 * TARGET_SHARE:.0f}%: {'met' if met else 'MISSED'}"
    )
    return met


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
