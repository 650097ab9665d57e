"""Helpers shared by the tests."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

import pgferry
from pgferry.delivery.model import Subscription
from pgferry.receiver import Receiver
from pgferry.relay.process import Relay

#: The ``receiver_factory`` fixture: ``await make(behaviour)`` -> (receiver, its URL).
MakeReceiver = Callable[..., Awaitable[tuple[Receiver, str]]]

#: Prometheus samples by (name, sorted labels), as ``scrape`` returns them.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

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


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
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


def pgferry_env(url: str) -> dict[str, str]:
    """The environment a `pgferry` subprocess of the tests gets: the database URL and PATH, and one relay
    process per `pgferry run` (see tests/conftest.py), nothing else."""
    return {"PGFERRY_DATABASE_URL": url, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGFERRY_PROCESSES": "1"}


async def owns(relay: Relay, n: int) -> bool:
    """Whether the relay (running in this process) delivers at least ``n`` subscriptions."""
    return relay.ownership is not None and len(relay.ownership.owned) >= n


async def received(receiver: Receiver, n: int, prefix: str = "") -> bool:
    """Whether ``receiver`` has answered at least ``n`` requests to paths starting with ``prefix``."""
    return sum(1 for r in receiver.received if r.path.startswith(prefix)) >= n


class RelayProcess:
    """A `pgferry run` subprocess whose log lines are collected as they come."""

    def __init__(self, cmd: list[str], url: str) -> None:
        self.proc = subprocess.Popen(
            [*cmd, "run", "--database-url", url],
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


async def scrape(url: str) -> Samples:
    """Every sample a metrics endpoint serves (a relay's /metrics)."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
