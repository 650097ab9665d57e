"""`pgferry bench sinks`: the seed's scenarios delivered to a webhook, NATS JetStream and Redis Streams.

Side by side in one run, so that the ratios hold however fast the machine
is that day: pgbench inserts into the captured table, one relay (`pgferry
run`, its own process) delivers the subscription, and the destination is
the tracking receiver (`bench webhooks`), a JetStream stream on a local
nats-server (file storage), or a stream on a local redis-server (append-only
file, fsync every second). The brokers are scored after each scenario from
what they stored, read back with their own clients (nothing consumes them
during the run, so nothing competes for the cores): unique events and
duplicates by webhook-id, and commit-to-store latency from the broker's own
timestamps (JetStream's stored time, the Redis entry id's milliseconds)
against the row's ``harvested_at``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import click
import orjson

from pgferry import db
from pgferry.bench.brokers import NatsServer, RedisServer
from pgferry.bench.pgbench import run_pgbench
from pgferry.bench.procstat import cpu_by_command, cpu_spent
from pgferry.bench.relay import running_relays
from pgferry.bench.report import Latency, ms, num
from pgferry.bench.sqlfiles import named
from pgferry.bench.webhooks import (
    HUNDRED_ROWS,
    SINGLE_ROW,
    WARM_UP_ROWS,
    WEBHOOK_PARTIES,
    Scenario,
    prepare,
    run_scenario,
    scenarios,
)
from pgferry.errors import PgferryError

SINKS = ("webhook", "nats", "redis")
#: The JetStream stream and subject, and the Redis stream, the bench delivers to.
NATS_STREAM, NATS_SUBJECT, REDIS_STREAM = "BENCH", "bench.events", "bench"


@dataclass
class SinkOutcome:
    sink: str
    scenario: Scenario
    inserted: int
    unique: int
    duplicates: int
    insert_seconds: float
    throughput: float
    latency: Latency
    last_after_commit_s: float
    #: CPU seconds of the relay and of the receiver or broker, from the first insert to the last delivery
    cpu: dict[str, float]


class Stored(Protocol):
    """What a broker holds for the bench, read with the broker's own client."""

    #: what the broker's command line holds (its CPU is read by it)
    marker: str
    target: str

    async def clear(self) -> None: ...
    async def count(self) -> int: ...
    async def read(self) -> list[tuple[str, float, float]]:
        """(webhook-id, harvested_at, stored at) of every message, as epoch seconds."""
        ...


class JetStreamStored:
    def __init__(self, server: NatsServer, js: Any) -> None:
        self.target = f"{server.url}/{NATS_SUBJECT}"
        self.js = js
        self.marker = str(server.dir)  # its config file's path

    async def clear(self) -> None:
        with contextlib.suppress(Exception):
            await self.js.delete_stream(NATS_STREAM)
        await self.js.add_stream(name=NATS_STREAM, subjects=[NATS_SUBJECT])

    async def count(self) -> int:
        return int((await self.js.stream_info(NATS_STREAM)).state.messages)

    async def read(self) -> list[tuple[str, float, float]]:
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig

        # No acks: a pull consumer that waits for them stops handing out messages at max_ack_pending.
        config = ConsumerConfig(ack_policy=AckPolicy.NONE)
        sub = await self.js.pull_subscribe(NATS_SUBJECT, stream=NATS_STREAM, config=config)
        out = []
        while True:
            try:
                batch = await sub.fetch(2000, timeout=1)
            except nats.errors.TimeoutError:
                break
            for m in batch:
                out.append((m.headers["webhook-id"], _harvested(m.data), m.metadata.timestamp.timestamp()))
        await sub.unsubscribe()
        return out


class RedisStored:
    def __init__(self, server: RedisServer, client: Any) -> None:
        self.target = f"{server.url}/0?stream={REDIS_STREAM}"
        self.client = client
        self.marker = f"127.0.0.1:{server.port}"  # in the title redis-server gives itself

    async def clear(self) -> None:
        await self.client.flushdb()

    async def count(self) -> int:
        return int(await self.client.xlen(REDIS_STREAM))

    async def read(self) -> list[tuple[str, float, float]]:
        out: list[tuple[str, float, float]] = []
        after = "-"
        while True:
            entries = await self.client.xrange(REDIS_STREAM, min=after, count=10000)
            if not entries:
                return out
            for entry_id, fields in entries:
                at = int(entry_id.split(b"-")[0]) / 1000
                out.append((fields[b"webhook-id"].decode(), _harvested(fields[b"payload"]), at))
            after = "(" + entries[-1][0].decode()


def _harvested(payload: bytes) -> float:
    return datetime.fromisoformat(orjson.loads(payload)["record"]["harvested_at"]).timestamp()


@contextlib.asynccontextmanager
async def brokers(sinks: Sequence[str]) -> AsyncIterator[dict[str, Stored]]:
    """The broker servers the run needs, started here and stopped after."""
    import nats
    import redis.asyncio

    stored: dict[str, Stored] = {}
    async with contextlib.AsyncExitStack() as stack:
        if "nats" in sinks:
            nats_server = NatsServer()
            stack.callback(nats_server.close)
            nats_server.start()
            client = await nats.connect(nats_server.url)
            stack.push_async_callback(client.close)
            stored["nats"] = JetStreamStored(nats_server, client.jetstream())
        if "redis" in sinks:
            redis_server = RedisServer()
            stack.callback(redis_server.close)
            redis_server.start()
            r = redis.asyncio.Redis(port=redis_server.port)
            stack.push_async_callback(r.aclose)
            stored["redis"] = RedisStored(redis_server, r)
        yield stored


async def run_broker_scenario(
    url: str, scenario: Scenario, sink: str, stored: Stored, timeout: float, rate: float | None
) -> SinkOutcome:
    conn = await db.connect(url)
    try:
        await conn.execute(named("webhooks.sql", "reset"))
        await stored.clear()
        await conn.execute(named("webhooks.sql", "subscribe"), stored.target, scenario.batch_size,
                           scenario.max_in_flight, 1)  # fmt: skip
        await conn.execute(named("webhooks.sql", "checkpoint"))
        script = SINGLE_ROW if scenario.rows_per_tx == 1 else HUNDRED_ROWS
        async with running_relays(url, relays=1, processes=1, max_seconds=timeout + 600):
            per_client = max(1, WARM_UP_ROWS // (scenario.rows_per_tx * scenario.clients))
            await run_pgbench(url, script, clients=scenario.clients, transactions=per_client)
            warm = await conn.fetchval(named("webhooks.sql", "rows"))
            await _until(lambda: _at_least(stored, warm), time.time() + timeout, f"the {warm} warm-up events")
            await stored.clear()  # scored from here: only what the scenario inserted
            parties = {"relay": WEBHOOK_PARTIES["relay"], "sink": stored.marker}
            started = time.time()
            cpu_before = cpu_by_command(parties)
            await run_pgbench(url, script, clients=scenario.clients, transactions=scenario.transactions, rate=rate)
            insert_end = time.time()
            inserted = await conn.fetchval(named("webhooks.sql", "rows")) - warm
            with contextlib.suppress(PgferryError):  # a shortfall is reported, not raised
                await _until(lambda: _at_least(stored, inserted), insert_end + timeout, "the events")
            cpu = cpu_spent(cpu_before, cpu_by_command(parties))
            await asyncio.sleep(0.5)  # late duplicates would arrive now
        for row in await conn.fetch(named("webhooks.sql", "failure_classes")):
            click.echo(f"  failed attempts: {row['n']} x {row['error_class']}", err=True)
    finally:
        await conn.close()
    messages = await stored.read()
    ids = {m[0] for m in messages}
    last_at = max((m[2] for m in messages), default=insert_end)
    return SinkOutcome(
        sink=sink,
        scenario=scenario,
        inserted=inserted,
        unique=len(ids),
        duplicates=len(messages) - len(ids),
        insert_seconds=insert_end - started,
        throughput=len(ids) / max(1e-9, last_at - started),
        latency=Latency.of([(m[2] - m[1]) * 1000 for m in messages]),
        last_after_commit_s=last_at - insert_end,
        cpu=cpu,
    )


async def _at_least(stored: Stored, n: int) -> bool:
    return await stored.count() >= n


async def _until(check: Any, deadline: float, what: str) -> None:
    while not await check():
        if time.time() > deadline:
            raise PgferryError(f"{what} did not all arrive in time")
        await asyncio.sleep(0.1)


async def run_sinks_bench(
    url: str, scale: float, only: Sequence[int], sinks: Sequence[str], timeout: float, rate: float | None
) -> list[SinkOutcome]:
    await prepare(url)
    every = scenarios(scale)
    results = []
    async with brokers(sinks) as stored:
        for number in only:
            scenario = every[number - 1]
            for sink in sinks:
                click.echo(f"scenario {number}: {scenario.name} -> {sink} ...", err=True)
                if sink == "webhook":
                    o = await run_scenario(url, scenario, timeout, rate)
                    results.append(SinkOutcome(sink, scenario, o.inserted, o.unique, o.duplicates, o.insert_seconds,
                                               o.throughput, o.latency, o.last_after_commit_s, o.cpu))  # fmt: skip
                else:
                    results.append(await run_broker_scenario(url, scenario, sink, stored[sink], timeout, rate))
    return results


def print_table(results: Sequence[SinkOutcome]) -> None:
    header = (
        f"{'scenario':<28} {'sink':<8} {'rows':>9} {'insert/s':>9} {'ev/s':>9} {'ratio':>6}"
        f" {'p50 ms':>7} {'p99 ms':>7} {'last+s':>7} {'lost':>5} {'dups':>5} {'relay us':>8} {'sink us':>8}"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for o in results:
        insert_rate = o.inserted / max(1e-9, o.insert_seconds)
        click.echo(
            f"{o.scenario.name[:28]:<28} {o.sink:<8} {num(o.inserted):>9} {num(insert_rate):>9}"
            f" {num(o.throughput):>9} {o.throughput / insert_rate:>6.2f} {ms(o.latency.p50):>7} {ms(o.latency.p99):>7}"
            f" {o.last_after_commit_s:>7.2f} {o.inserted - o.unique:>5} {o.duplicates:>5}"
            f" {_per_event(o, 'relay'):>8} {_per_event(o, 'sink'):>8}"
        )
    click.echo(
        "insert/s: rows pgbench inserted per second; ev/s: events delivered (received by the webhook, stored by "
        "the broker) / (last one - first insert); ratio: ev/s / insert/s; p50/p99: commit to receipt or store; "
        "last+s: the last one after the last commit; lost: inserted, never delivered; dups: stored more than once; "
        "relay us, sink us: CPU microseconds per delivered event of the relay and of the receiver or broker, from "
        "the first insert to the last delivery (/proc)."
    )


def _per_event(o: SinkOutcome, role: str) -> str:
    return f"{o.cpu[role] * 1e6 / o.unique:.1f}" if role in o.cpu and o.unique else "-"
