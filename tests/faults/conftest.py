"""What every fault test shares: a steady publisher and the final count.

Each fault test ends the same way: it stops the load, waits until every
committed event was received or dead-lettered, and counts. "Committed" is
what is in the log (``ferry.events``), not what the publisher believes: a
publish whose commit acknowledgement was lost in a PostgreSQL crash may
still have committed, and must then be delivered too.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
import orjson
import pytest

from pgferry import db
from pgferry.receiver import Receiver
from tests import helpers
from tests.faults.proxy import FaultProxy


class Load:
    """Publishes ``per_round`` events to stream ``s`` every ``interval`` seconds, on its own
    connection, until stopped; reconnects through PostgreSQL restarts. Each payload carries
    a unique ``seq`` so a received body can be traced to exactly one publish."""

    def __init__(self, url: str, *, per_round: int = 20, interval: float = 0.05, stream: str = "s") -> None:
        self.url = url
        self.per_round = per_round
        self.interval = interval
        self.stream = stream
        self.acked: list[int] = []  # event ids whose commit we saw acknowledged
        self.failed_rounds = 0
        self._seq = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await db.connect(self.url)
                    seqs = range(self._seq, self._seq + self.per_round)
                    self._seq += self.per_round
                    ids = await conn.fetch(
                        "select ferry.publish($1, jsonb_build_object('seq', n)) as id from unnest($2::int[]) as s(n)",
                        self.stream,
                        list(seqs),
                    )
                    self.acked += [r["id"] for r in ids]
                except (*db.CONNECTION_ERRORS, asyncpg.PostgresError):
                    self.failed_rounds += 1
                    if conn is not None:
                        conn.terminate()
                    conn = None
                await asyncio.sleep(self.interval)
        finally:
            if conn is not None:
                conn.terminate()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


@dataclass
class Tally:
    """The final count of a fault test."""

    committed: int
    delivered: int  # unique events received with a 2xx answer
    dead: int
    lost: list[int]
    duplicates: int  # deliveries beyond the first, all with the same webhook-id and body
    requests: int
    notes: dict[str, object] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.notes.items())
        return (
            f"committed={self.committed} delivered={self.delivered} dead={self.dead} lost={len(self.lost)} "
            f"duplicates={self.duplicates} requests={self.requests}{extra}"
        )


def received_ids(receivers: list[Receiver]) -> list[int]:
    return [event_id for receiver in receivers for event_id in helpers.received_ids(receiver)]


async def committed_ids(conn: asyncpg.Connection, stream: str = "s") -> set[int]:
    return {r["id"] for r in await conn.fetch("select id from ferry.events where stream = $1", stream)}


async def dead_ids(conn: asyncpg.Connection, subscription: str | None = None) -> set[int]:
    rows = await conn.fetch(
        "select event_id from ferry.dead_letters where $1::text is null or subscription = $1", subscription
    )
    return {r["event_id"] for r in rows}


async def settle(
    conn: asyncpg.Connection,
    receivers: list[Receiver],
    *,
    acked: list[int],
    timeout: float = 60.0,
    stream: str = "s",
    subscription: str | None = None,
) -> Tally:
    """Wait until every committed event was received or dead-lettered (or ``timeout``), then count.

    Asserts nothing itself, except the integrity of what was received: every
    delivery of an event carries the same webhook-id and the same body, and
    every acknowledged publish is in the log.
    """
    deadline = time.monotonic() + timeout
    while True:
        committed = await committed_ids(conn, stream)
        dead = await dead_ids(conn, subscription)
        got = set(received_ids(receivers))
        lost = sorted(committed - got - dead)
        if not lost or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert set(acked) <= committed, "an acknowledged publish is missing from the log"
    # Integrity: one webhook-id <-> one body <-> one seq, whatever number of times it came.
    bodies: dict[str, set[bytes]] = defaultdict(set)
    for rec in receivers:
        for r in rec.received:
            bodies[r.headers["webhook-id"]].add(r.body)
    assert all(len(b) == 1 for b in bodies.values()), "one webhook-id arrived with different bodies"
    seqs = [orjson.loads(next(iter(b)))["seq"] for b in bodies.values()]
    assert len(seqs) == len(set(seqs)), "one event arrived under two webhook-ids"
    ids = received_ids(receivers)
    assert set(ids) <= committed, "something was delivered that is not in the log"
    return Tally(
        committed=len(committed),
        delivered=len(set(ids)),
        dead=len(dead),
        lost=lost,
        duplicates=len(ids) - len(set(ids)),
        requests=sum(rec.stats.requests for rec in receivers),
    )


@pytest.fixture
async def proxies() -> AsyncIterator[Callable[[int], Awaitable[FaultProxy]]]:
    started: list[FaultProxy] = []

    async def make(target_port: int) -> FaultProxy:
        proxy = FaultProxy(target_port)
        await proxy.start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        await proxy.stop()


def port_of(url: str) -> int:
    return int(url.split("127.0.0.1:", 1)[1].split("/", 1)[0])
