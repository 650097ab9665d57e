"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import inspect
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import termios
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import aiohttp
import asyncpg

import pgferry
from pgferry import db, sql
from pgferry.api_tokens import Decision
from pgferry.delivery.model import Subscription
from pgferry.embedded import free_port
from pgferry.errors import TokenStoreUnavailable
from pgferry.log.ticker import TickerSettings
from pgferry.ops.metrics import Samples, parse_samples, series_sum
from pgferry.receiver import Action, Received, Receiver, Respond
from pgferry.relay.ownership import OwnershipSettings
from pgferry.relay.process import Relay, RelaySettings

#: The ``receiver_factory`` fixture: ``await make(behaviour)`` -> (receiver, its URL).
MakeReceiver = Callable[..., Awaitable[tuple[Receiver, str]]]


#: Retries within a test's patience (20 ms, at most 200 ms apart), as ferry.subscribe arguments.
FAST_RETRY = "retry_base_ms => 20, retry_max_ms => 200"

#: Chromium, when installed (scripts/test installs it), and its flags as root in a sandboxless
#: container, with nothing that calls out to the internet.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


#: A fixed instant for tests of pure delivery logic.
NOW = datetime(2026, 11, 30, tzinfo=UTC)


def subscription(**settings: Any) -> Subscription:
    """A webhook subscription as the engine sees it, with ``settings`` changed (pure tests)."""
    base = Subscription(
        name="hook", streams=("s",), url="http://127.0.0.1:9/hook", headers={}, secrets=(), batch_size=1,
        max_in_flight=8, ordered=False, timeout_ms=1000, connect_timeout_ms=1000, max_attempts=3,
        max_age=timedelta(days=1), retry_base_ms=10, retry_max_ms=100, state="active", updated_at=NOW,
    )  # fmt: skip
    return dataclasses.replace(base, **settings)


async def scrape(url: str) -> Samples:
    """The samples a relay's metrics server answers with at ``url``."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse_samples(await response.text())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric's samples, by their sorted labels."""
    return {labels: v for (sample, labels), v in samples.items() if sample == name}


async def tick(conn: asyncpg.Connection) -> int | None:
    """Take a tick now, as the relay's ticker would."""
    return await conn.fetchval("select ferry.tick()")  # type: ignore[no-any-return]


async def read_all(ferry: pgferry.Ferry, conn: asyncpg.Connection, consumer: str, **kwargs: Any) -> list[pgferry.Event]:
    """Tick, then read and ack every batch the consumer has right now."""
    await tick(conn)
    events: list[pgferry.Event] = []
    reader = ferry.read(consumer, poll_interval=0.05, **kwargs)
    it = aiter(reader)
    try:
        while True:
            try:
                batch = await asyncio.wait_for(anext(it), 0.5)
            except TimeoutError:
                return events
            events.extend(batch.events)
            await batch.ack()
    finally:
        await it.aclose()  # type: ignore[attr-defined]


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait until ``check()`` (a coroutine's result, or a plain value) is true, for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if await result if inspect.isawaitable(result) else result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def cli(
    cmd: list[str],
    url: str,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run `pgferry ARGS` as a real subprocess against the database at ``url`` (``stdin``: text fed to it)."""
    return await asyncio.to_thread(
        subprocess.run,
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        env={**pgferry_env(url), "COLUMNS": "250", **(env or {})},
    )


async def cli_in_terminal(
    cmd: list[str], url: str, *args: str, columns: int = 120, timeout: float = 60
) -> tuple[int, list[str]]:
    """Run `pgferry ARGS` on a pseudo-terminal ``columns`` wide, as a person at a terminal would:
    its exit status and every screen line it drew (each redraw of a progress bar is one), with
    terminal control sequences taken out."""

    def run() -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        env = {**pgferry_env(url), "TERM": "xterm-256color", "COLUMNS": str(columns)}
        try:
            proc = subprocess.Popen([*cmd, *args], stdin=follower, stdout=follower, stderr=follower, env=env)
        finally:
            os.close(follower)
        out = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([leader], [], [], 0.5)
                if ready:
                    try:
                        chunk = os.read(leader, 65536)
                    except OSError:  # EIO: every end of the terminal is closed (the process ended)
                        break
                    if not chunk:
                        break
                    out += chunk
            else:
                proc.kill()
        finally:
            os.close(leader)
        return proc.wait(10), bytes(out)

    status, out = await asyncio.to_thread(run)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", out.decode(errors="replace"))
    return status, [line.rstrip() for line in re.split(r"[\r\n]+", text) if line.strip()]


def pgferry_env(url: str) -> dict[str, str]:
    """The environment a `pgferry` subprocess of the tests gets: the database URL and PATH, and one relay
    process per `pgferry run` (see tests/conftest.py), nothing else."""
    return {"PGFERRY_DATABASE_URL": url, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGFERRY_PROCESSES": "1"}


#: Relay settings for tests: quick ticks, claims and leader retries.
FAST = RelaySettings(
    ticker=TickerSettings(busy_interval=0.005, idle_interval=0.05, maintain_every=0.5),
    ownership=OwnershipSettings(claim_interval=0.2, stop_grace=2.0),
    leader_retry_interval=0.2,
)


class AfterQuery:
    """A pool whose connections run ``hook`` (with the result) after ``method`` (e.g. "fetch") ran
    ``query`` (a name in queries.sql), before handing the result back: holds a statement's answer
    back to play a race a busy machine shows. Everything else goes to ``pool``'s connections."""

    def __init__(self, pool: asyncpg.Pool, method: str, query: str, hook: Callable[[Any], Awaitable[None]]) -> None:
        self.pool, self.method, self.query, self.hook = pool, method, sql.query(query), hook

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        async with self.pool.acquire() as conn:
            yield _HookedConnection(conn, self)


class _HookedConnection:
    def __init__(self, conn: asyncpg.Connection, pool: AfterQuery) -> None:
        self._conn, self._pool = conn, pool

    def __getattr__(self, name: str) -> object:
        found = getattr(self._conn, name)
        if name != self._pool.method:
            return found

        async def call(query: str, *args: object) -> object:
            result = await found(query, *args)
            if query == self._pool.query:
                await self._pool.hook(result)
            return result

        return call


class RunningRelay:
    """A relay running in this process, on this event loop, until ``stop``."""

    def __init__(self, url: str, settings: RelaySettings = FAST) -> None:
        self.relay = Relay(url, settings)
        self.stop_event = asyncio.Event()
        self.task = asyncio.create_task(self.relay.run(self.stop_event))

    async def stop(self) -> None:
        self.stop_event.set()
        await asyncio.wait_for(self.task, 30)


class ApiRelay(RunningRelay):
    """A relay in this process serving the streams HTTP API (the ``start_api`` fixture)."""

    @property
    def base(self) -> str:
        return self.relay.addresses["api"]

    async def started(self) -> str:
        async def up() -> bool:
            return "api" in self.relay.addresses

        await eventually(up, what="the streams API to listen")
        return self.base


class TokensDown:
    """Put in place of an API relay's authorizer: while ``down``, every request finds the API
    tokens due for a reload that fails (the database down: ``TokenStoreUnavailable``, a 503);
    otherwise it asks the relay's own ``TokenStore``."""

    def __init__(self, relay: ApiRelay) -> None:
        api = relay.relay.api
        assert api is not None and api.authorizer is not None
        self.inner, self.down = api.authorizer, True
        api.authorizer = self

    async def authorize(self, bearer: str | None, stream: str, action: Literal["read", "write"]) -> Decision:
        if self.down:
            raise TokenStoreUnavailable("cannot load the API tokens: [Errno 111] Connection refused")
        return await self.inner.authorize(bearer, stream, action)


#: The ``start_api`` fixture (tests/streams/conftest.py): ``await start_api(**api_settings)``.
StartApi = Callable[..., Awaitable[ApiRelay]]


@contextlib.asynccontextmanager
async def api_relay_process(
    pgferry_cmd: list[str],
    db_url: str,
    *,
    log: Path | None = None,
    wrapper: Sequence[str] = (),
    args: Sequence[str] = (),
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`pgferry run --api-port PORT --api-allow-loopback ARGS` as a process of its own (run by
    ``wrapper``, e.g. prlimit; its output to ``log``, else none), once its streams API serves:
    the process and the API's base URL (``.../v1/streams``). Stopped when the block ends
    (SIGTERM, killed if it has not exited 20 s later)."""
    port = free_port()
    cmd = [*wrapper, *pgferry_cmd, "run", "--database-url", db_url, "--api-port", str(port), "--api-allow-loopback",
           *args]  # fmt: skip
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("wb")) if log is not None else asyncio.subprocess.DEVNULL
        relay = await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=out, env=pgferry_env(db_url))
    base = f"http://127.0.0.1:{port}/v1/streams"
    try:

        async def serving() -> bool:
            assert relay.returncode is None, "the relay exited"
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{base}/probe/events") as r:
                    return r.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await eventually(serving, timeout=20, what="the relay's streams API")
        yield relay, base
    finally:
        if relay.returncode is None:
            relay.terminate()
            try:
                await asyncio.wait_for(relay.wait(), 20)
            except TimeoutError:
                relay.kill()
                await relay.wait()


async def owns(relay: Relay, n: int) -> bool:
    """Whether the relay (running in this process) delivers at least ``n`` subscriptions."""
    return relay.ownership is not None and len(relay.ownership.owned) >= n


async def received(receiver: Receiver, n: int, prefix: str = "") -> bool:
    """Whether ``receiver`` has answered at least ``n`` requests to paths starting with ``prefix``."""
    return sum(1 for r in receiver.received if r.path.startswith(prefix)) >= n


class RelayProcess:
    """A `pgferry run` subprocess whose log lines are collected as they come."""

    def __init__(self, cmd: list[str], url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*cmd, "run", "--database-url", url, *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def redirect_to_self(request: Received) -> Action:
    """A receiver behaviour: redirect every request to itself (a redirect loop)."""
    return Respond(302, b"", (("location", f"http://{request.headers['host']}{request.path}"),))


async def net_responses(conn: asyncpg.Connection, n: int, timeout: float = 20) -> list[asyncpg.Record]:
    """The rows of net._http_response (pg_net API), once there are ``n``, by request id."""

    async def enough() -> bool:
        return bool(await conn.fetchval("select count(*) from net._http_response") >= n)

    await eventually(enough, timeout=timeout, what=f"{n} responses")
    return list(await conn.fetch("select * from net._http_response order by id"))


async def metric_sum(url: str, name: str) -> float:
    """A Prometheus series summed over its labels, as the metrics server at ``url`` serves it now."""
    return series_sum(await scrape(url), name)


def received_ids(receiver: Receiver) -> list[int]:
    """The event ids a receiver got, in the order it got them (from each request's webhook-id)."""
    return [int(r.headers["webhook-id"].removeprefix("evt_")) for r in receiver.received]


async def all_delivered(receiver: Receiver, expected: set[int]) -> None:
    """Until ``receiver`` got every event in ``expected`` (30 s at most)."""

    async def check() -> bool:
        return expected <= set(received_ids(receiver))

    await eventually(check, timeout=30, what=f"{len(expected)} deliveries")


@contextlib.asynccontextmanager
async def explained(url: str, **settings: str) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    """A session whose statements' plans, nested ones included, come back as notices (auto_explain),
    with the generic plans a long-lived session settles on unless ``settings`` say otherwise (each
    ``set`` in the session); and the list they are collected in."""
    plans: list[str] = []
    session = await db.connect(url)
    try:
        session.add_log_listener(lambda _conn, message: plans.append(message.message))
        await session.execute("load 'auto_explain'")
        explain = {"auto_explain.log_min_duration": "0", "auto_explain.log_nested_statements": "on",
                   "auto_explain.log_level": "notice", "plan_cache_mode": "force_generic_plan"}  # fmt: skip
        for setting, value in {**explain, **settings}.items():
            await session.execute(f"set {setting} = '{value}'")
        yield session, plans
    finally:
        await session.close()


#: ferry.webhook_steps' parameters, in the order of the relay's query (sql/queries.sql: webhook_steps)
STEPS_PARAMETERS = ("subscriptions", "consumers", "epochs", "ordered", "ack_from", "ack_to", "peeks", "peek_after",
                    "attempt_req", "event_ids", "attempt_nos", "statuses", "latencies", "max_events", "max_bytes",
                    "spans", "peek_until", "resume_after", "ack_part_end", "ack_part_done", "attempt_runs")  # fmt: skip

#: per request, unless given: a read from the cursor, unordered, acknowledging nothing
_PER_REQUEST: dict[str, object] = {"ordered": False, "peeks": True}
_PER_REQUEST_NULL = ("epochs", "ack_from", "ack_to", "peek_after", "peek_until", "resume_after", "ack_part_end",
                     "ack_part_done")  # fmt: skip

#: attempts one per event: none unless given
_PER_ATTEMPT = ("attempt_req", "event_ids", "attempt_nos", "statuses", "latencies")


async def webhook_steps(
    conn: asyncpg.Connection, subscriptions: list[str], consumers: list[str], **args: Any
) -> list[asyncpg.Record]:
    """The relay's ferry.webhook_steps query with its arguments by name. Left out: each request
    reads from its cursor (unordered, no epoch) and acknowledges nothing, no attempts, no bounds."""
    unknown = set(args) - set(STEPS_PARAMETERS)
    assert not unknown, f"ferry.webhook_steps has no parameter {unknown}"
    n = len(subscriptions)
    given = {"subscriptions": subscriptions, "consumers": consumers, **args}
    defaults: dict[str, object] = {name: [value] * n for name, value in _PER_REQUEST.items()}
    defaults |= {name: [None] * n for name in _PER_REQUEST_NULL} | {name: [] for name in _PER_ATTEMPT}
    values = [given[name] if name in given else defaults.get(name) for name in STEPS_PARAMETERS]
    return await conn.fetch(sql.query("webhook_steps"), *values)  # type: ignore[no-any-return]
