"""Partitioned subscriptions (migration 0018): one subscription's events spread over N partitions by
key hash, each with its own consumer and worker, claimed by any relay like a subscription. Per-key
order holds while partitions move between relays, and across a change of N on a live subscription."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

import asyncpg
import orjson
import pytest

import pgferry
from pgferry import db, sql
from pgferry.delivery.model import consumer_name
from pgferry.receiver import Received, Receiver, Respond, Slow
from tests.helpers import FAST, MakeReceiver, RelayProcess, RunningRelay, eventually

KEYS = 24


def deliveries(receiver: Receiver) -> list[tuple[str, int]]:
    """(key, n) of every request answered, in the order answered (batch_size 1: one event each)."""
    return [(r.headers["pgferry-key"], orjson.loads(r.body)["n"]) for r in receiver.received]


def first_arrivals_in_key_order(seen: list[tuple[str, int]]) -> None:
    """Each key's events arrived (first time) in the order they were written, none missing."""
    firsts: dict[str, list[int]] = defaultdict(list)
    for key, n in seen:
        if n not in firsts[key]:
            firsts[key].append(n)
    for key, ns in firsts.items():
        assert ns == sorted(ns), f"key {key} out of order: {ns}"
        assert ns == list(range(len(ns))), f"key {key} lost events: {ns}"


class Writer:
    """Publishes one event per key per transaction, keys k0.., each key's events numbered from 0."""

    def __init__(self, ferry: pgferry.Ferry, stream: str = "s") -> None:
        self.ferry, self.stream, self.rounds = ferry, stream, 0

    async def round(self) -> None:
        async with self.ferry.pool.acquire() as conn, conn.transaction():
            for k in range(KEYS):
                await conn.execute(
                    "select ferry.publish($1, $2::text::jsonb, $3)",
                    self.stream, orjson.dumps({"n": self.rounds}).decode(), f"k{k}",
                )  # fmt: skip
        self.rounds += 1

    async def run(self, rounds: int, pause: float) -> None:
        for _ in range(rounds):
            await self.round()
            await asyncio.sleep(pause)

    @property
    def events(self) -> int:
        return self.rounds * KEYS


async def units(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """What each live relay delivers (ferry.relays.owned)."""
    rows = await conn.fetch("select id, owned from ferry.relays where heartbeat_at > now() - interval '5 seconds'")
    return {r["id"]: sorted(r["owned"]) for r in rows}


async def test_partitions_are_consumers_named_and_filled_as_documented(
    conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    await ferry.subscribe("hot", ["s"], "http://127.0.0.1:9/hook", partitions=4)
    rows = await conn.fetch("select name, part, parts from ferry.consumers where subscription = 'hot' order by part")
    assert [r["name"] for r in rows] == [consumer_name("hot", p, 4) for p in range(4)]
    assert [r["name"] for r in rows] == [
        await conn.fetchval("select ferry._partition_consumer('hot', $1, 4)", p) for p in range(4)
    ]
    # Keys spread evenly and always land in the same partition; events without a key go by id.
    spread = await conn.fetch(
        "select ferry._partition_of('key-' || g, g, 4) as p, count(*) as n from generate_series(1, 8000) g group by 1"
    )
    assert sorted(r["p"] for r in spread) == [0, 1, 2, 3]
    assert all(1700 < r["n"] < 2300 for r in spread), spread
    assert await conn.fetchval("select ferry._partition_of('a', 1, 4) = ferry._partition_of('a', 999, 4)")
    assert [await conn.fetchval("select ferry._partition_of(null, $1, 4)", i) for i in range(4)] == [0, 1, 2, 3]
    status = {r["name"]: r for r in await ferry.status()}
    assert status["hot"]["partitions"] == 4 and status["hot"]["draining"] == 0
    # Subscribing again with the same number changes nothing; removing it removes every partition.
    await ferry.subscribe("hot", ["s", "t"], "http://127.0.0.1:9/hook", partitions=4)
    assert (
        await conn.fetchval("select count(*) from ferry.consumers where subscription = 'hot' and streams = '{s,t}'")
        == 4
    )
    await ferry.unsubscribe("hot")
    assert await conn.fetchval("select count(*) from ferry.consumers where name like 'webhook:hot%'") == 0


async def test_no_tick_commits_between_a_change_of_partitions_choosing_its_tick_and_committing(
    conn: asyncpg.Connection, ferry: pgferry.Ferry, db_url: str
) -> None:
    """A tick committed after the switch tick T was chosen, but before drain_to was visible, let an old
    partition read past T, and the new partitions sent those events again (outside probe: duplicates
    changing partitions under load)."""
    await ferry.subscribe("hot", ["s"], "http://127.0.0.1:9/hook", partitions=2)
    await ferry.publish("s", {"n": 1})
    ticker = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.execute("select ferry.subscribe('hot', array['s'], 'http://127.0.0.1:9/hook', partitions => 3)")
            await ticker.execute("set statement_timeout = '300ms'")
            with pytest.raises(asyncpg.QueryCanceledError):  # waits for the switch to commit
                await ticker.fetchval("select ferry.tick()")
        await ticker.execute("reset statement_timeout")
        tick_id = await ticker.fetchval("select ferry.tick()")
        drain_to = await conn.fetchval("select max(drain_to) from ferry.consumers where subscription = 'hot'")
        assert tick_id is not None and tick_id > drain_to
    finally:
        await ticker.close()


@pytest.mark.parametrize("max_bytes", [None, 1 << 20])
@pytest.mark.parametrize("subscriptions", [("a",), ("a", "b")])
async def test_each_partition_reads_its_own_events_alone_or_sharing_a_read(
    conn: asyncpg.Connection, ferry: pgferry.Ferry, max_bytes: int | None, subscriptions: tuple[str, ...]
) -> None:
    """ferry.webhook_steps directly, unbounded (a relay older than 0015) and bounded (every relay since):
    partitions split a range between them, and partition p of two subscriptions share one read."""
    for name in subscriptions:
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/hook", partitions=2)
    start = await conn.fetchval("select ferry.tick(true)")
    ids = [await ferry.publish("s", {"n": n}, key=f"k{n % 7}" if n % 5 else None) for n in range(60)]
    await conn.fetchval("select ferry.tick(true)")
    requests = [(s, p) for s in subscriptions for p in (0, 1)]
    n = len(requests)
    rows = await conn.fetch(
        sql.query("webhook_steps"),
        [s for s, _ in requests], [consumer_name(s, p, 2) for s, p in requests], [None] * n, [False] * n,
        [None] * n, [None] * n, [True] * n, [start] * n, [], [], [], [], [], None, max_bytes, None, None, None,
        None, None, None,
    )  # fmt: skip
    got: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        if row["id"] is not None:
            for req in row["reqs"]:
                got[req].append(row["id"])
    of = dict(await conn.fetch("select id, ferry._partition_of(key, id, 2) from ferry.events where id = any($1)", ids))
    for req, (_, part) in enumerate(requests, 1):
        assert got[req] == [i for i in ids if of[i] == part], f"request {req} (partition {part})"
    assert got[1] and got[2]
    reads = {tuple(r["reqs"]) for r in rows if r["id"] is not None}
    assert reads == ({(1, 3), (2, 4)} if len(subscriptions) == 2 else {(1,), (2,)})  # partition p of a and b: one read


@pytest.mark.parametrize("partitions", [0, 257])
async def test_a_bad_number_of_partitions_is_refused_clearly(ferry: pgferry.Ferry, partitions: int) -> None:
    with pytest.raises(pgferry.PgferryError, match="partitions must be between 1 and 256"):
        await ferry.subscribe("hot", ["s"], "http://127.0.0.1:9/hook", partitions=partitions)


async def test_partitions_spread_over_relays_and_move_when_one_is_killed(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start()
    await ferry.subscribe("hot", ["s"], url, partitions=4, ordered=True)
    relays = [RelayProcess(pgferry_cmd, db_url), RelayProcess(pgferry_cmd, db_url)]
    writer = Writer(ferry)
    try:

        async def split_evenly() -> bool:
            owned = await units(conn)
            return len(owned) == 2 and sorted(len(u) for u in owned.values()) == [2, 2]

        await eventually(split_evenly, timeout=30, what="each relay delivering 2 of the 4 partitions")
        assert sorted(u for us in (await units(conn)).values() for u in us) == [f"hot#{p}/4" for p in range(4)]
        writing = asyncio.create_task(writer.run(rounds=60, pause=0.05))
        await eventually(_at_least(receiver, 4 * KEYS), timeout=20, what="both relays delivering")
        relays[0].proc.send_signal(signal.SIGKILL)
        relays[0].proc.wait()

        async def one_owns_all() -> bool:
            owned = await units(conn)
            return any(len(u) == 4 for u in owned.values())

        await eventually(one_owns_all, timeout=30, what="the survivor delivering all 4 partitions")
        await writing
        await eventually(lambda: _distinct(receiver, writer.events), timeout=30, what="every event")
        first_arrivals_in_key_order(deliveries(receiver))
    finally:
        for relay in relays:
            relay.stop()
        await receiver.stop()


async def test_a_relay_joining_leaves_no_partition_owned_by_nobody(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    # Found by an outside probe: relay A owned 5 subscriptions and both partitions of a third;
    # when B joined, A handed over the 3 over its fair share (4) including both partitions, B took
    # one (its share of that subscription), A was at its fair share: the other had no owner.
    for name in "abcde":
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/")
    await ferry.subscribe("z", ["s"], "http://127.0.0.1:9/", partitions=2)
    everything = sorted([*"abcde", "z#0/2", "z#1/2"])
    relays = [RelayProcess(pgferry_cmd, db_url)]
    try:

        async def owned_by(count: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                owned = await units(conn)
                return len(owned) == count and sorted(u for us in owned.values() for u in us) == everything

            return check

        await eventually(await owned_by(1), timeout=30, what="one relay delivering everything")
        relays.append(RelayProcess(pgferry_cmd, db_url))
        await eventually(await owned_by(2), timeout=30, what="two relays delivering everything between them")
        await asyncio.sleep(5)  # and it stays so
        owned = await units(conn)
        assert sorted(u for us in owned.values() for u in us) == everything, owned
        assert sorted(len(us) for us in owned.values()) == [3, 4], owned
        assert all(sum(u.startswith("z#") for u in us) == 1 for us in owned.values()), "z spread over both"
    finally:
        for relay in relays:
            relay.stop()


async def test_a_subscription_handed_to_a_joining_relay_finishes_its_slow_requests_first(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """A hand-over waited stop_grace (2 s here), then cancelled what was in flight, and the next
    owner sent it again: a receiver answering in 15 s under timeout_ms 30000 got every event of a
    moved subscription twice (outside probe). Then it waited for the requests' own timeout, but
    only as long as the ownership connection could stay silent (session_timeout - command_timeout
    - claim_interval - 1: 17 s by default, 3.8 s with the liveness below), so a request slower than
    that still went twice. Now the hand-over waits in the background while the rounds go on."""
    arrived: list[str] = []

    def slow(received: Received) -> Slow:
        arrived.append(received.headers["webhook-id"])
        return Slow(5.0)

    _, url = await receiver_factory(slow)
    for name in ("a", "b"):
        await ferry.subscribe(name, [name], url, timeout_ms=8000)
    short = dataclasses.replace(FAST, liveness=db.Liveness(command_timeout=3.0, session_timeout=8.0))
    first = RunningRelay(db_url, short)
    second: RunningRelay | None = None
    try:
        await eventually(lambda: _owned_by(conn, 1), what="one relay delivering both")
        ids = [await ferry.publish(name, {"n": 1}) for name in ("a", "b")]
        sent = time.monotonic()
        await eventually(lambda: len(arrived) == 2, what="both requests in flight")
        second = RunningRelay(db_url, short)  # the first hands one subscription over while its request waits
        await eventually(lambda: _owned_by(conn, 2), timeout=20, what="each relay delivering one")
        await asyncio.sleep(11 - (time.monotonic() - sent))  # past the requests' timeout: any re-send is done
        assert sorted(arrived) == sorted(f"evt_{i}" for i in ids), "each event sent once"
    finally:
        await first.stop()
        if second is not None:
            await second.stop()


async def _owned_by(conn: asyncpg.Connection, relays: int) -> bool:
    owned = await units(conn)
    return len(owned) == relays and sorted(u for us in owned.values() for u in us) == ["a", "b"]


async def test_a_hot_subscriptions_partitions_spread_over_relays_even_at_their_fair_share(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    # Found by `pgferry bench scale --layouts 4`: 4 partitions and one other subscription over 4
    # relay processes (a fair share of 2): one process held 2 partitions, another nothing, for good.
    await ferry.subscribe("other", ["t"], "http://127.0.0.1:9/")
    await ferry.subscribe("hot", ["s"], "http://127.0.0.1:9/", partitions=4)
    relay = RelayProcess(pgferry_cmd, db_url, "--processes", "4")
    try:

        async def spread() -> bool:
            owned = await units(conn)
            return (
                len(owned) == 4
                and all(owned.values())
                and all(sum(u.startswith("hot#") for u in us) <= 1 for us in owned.values())
                and sorted(u for us in owned.values() for u in us)
                == sorted(["other", *(f"hot#{p}/4" for p in range(4))])
            )

        await eventually(spread, timeout=40, what="each of 4 processes delivering one partition of hot")
    finally:
        relay.stop()


async def test_each_partition_retries_its_own_parked_events(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    failed_once: set[str] = set()

    def first_attempt_fails(request: Received) -> Respond:
        webhook_id = request.headers["webhook-id"]
        if webhook_id in failed_once:
            return Respond()
        failed_once.add(webhook_id)
        return Respond(500)

    receiver = Receiver(first_attempt_fails)
    url = await receiver.start()
    await ferry.subscribe("hot", ["s"], url, partitions=4, ordered=True, retry_base_ms=10, retry_max_ms=50)
    writer = Writer(ferry)
    relay = RunningRelay(db_url)
    try:
        await writer.run(rounds=5, pause=0.02)
        await eventually(lambda: _distinct(receiver, writer.events), timeout=30, what="every event, once retried")
        await asyncio.sleep(0.5)  # a duplicate retry would come now
        seen = deliveries(receiver)
        assert len(seen) == writer.events, "a parked event was retried by more than one partition"
        first_arrivals_in_key_order(seen)
        assert await conn.fetchval("select count(*) from ferry.retries") == 0
    finally:
        await relay.stop()
        await receiver.stop()


async def test_a_backfill_for_a_partitioned_subscription_reaches_it_once_and_nobody_else(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    await conn.execute("create table items (id int primary key, name text)")
    await conn.execute("insert into items select g, 'item ' || g from generate_series(1, 200) g")
    await conn.execute("select ferry.capture_table('items')")  # rows that exist: only the backfill sends them
    receiver, other = Receiver(lambda _: Respond()), Receiver(lambda _: Respond())
    url, other_url = await receiver.start(), await other.start()
    await ferry.subscribe("hot", ["public.items"], url, partitions=3)
    await ferry.subscribe("bystander", ["public.items"], other_url)
    relay = RunningRelay(db_url)
    try:
        backfill = await conn.fetchval("select ferry.backfill('items', subscription => 'hot', chunk_size => 50)")
        while (await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill))["state"] == "running":
            pass
        await eventually(lambda: _distinct(receiver, 200), timeout=20, what="every row, as READ events")
        await asyncio.sleep(0.3)
        ids = sorted(orjson.loads(r.body)["record"]["id"] for r in receiver.received)
        assert ids == list(range(1, 201)), "a row missing or sent twice"
        assert {orjson.loads(r.body)["type"] for r in receiver.received} == {"READ"}
        assert other.received == [], "the backfill reached another subscription"
    finally:
        await relay.stop()
        await receiver.stop()
        await other.stop()


async def test_changing_partitions_live_keeps_every_keys_order_and_delivers_each_event_once(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    # Before each change a burst the endpoint answers slowly: the old partitions are still
    # draining it when the new ones get later events of the same keys, answered at once.
    slow: set[int] = set()
    receiver = Receiver(lambda r: Slow(0.03) if orjson.loads(r.body)["n"] in slow else Respond())
    url = await receiver.start()

    async def subscribe(partitions: int) -> None:
        await ferry.subscribe("hot", ["s"], url, ordered=True, max_in_flight=4, partitions=partitions)

    await subscribe(1)
    writer = Writer(ferry)
    relays = [RunningRelay(db_url), RunningRelay(db_url)]
    try:
        for partitions in (4, 2, 1, 3):
            slow.update(range(writer.rounds, writer.rounds + 4))
            await writer.run(rounds=4, pause=0)
            await eventually(lambda: _ticked(conn), what="a tick covering the burst")
            await subscribe(partitions)
            await writer.run(rounds=3, pause=0)
            with pytest.raises(pgferry.PgferryError, match="still switching"):
                await subscribe(5)
            await eventually(lambda: _drained(conn), timeout=30, what="the old partitions draining")
            names = {r["name"] for r in await conn.fetch("select name from ferry.consumers where subscription = 'hot'")}
            assert names == {consumer_name("hot", p, partitions) for p in range(partitions)}
        await eventually(lambda: _distinct(receiver, writer.events), timeout=30, what="every event")
        seen = deliveries(receiver)
        assert len(seen) == writer.events, "an event was delivered twice"
        first_arrivals_in_key_order(seen)
    finally:
        for relay in relays:
            await relay.stop()
        await receiver.stop()


async def _ticked(conn: asyncpg.Connection) -> bool:
    """Whether the newest tick covers every event written (the change's tick will)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "select (select event_seq from ferry.ticks order by id desc limit 1) >= (select max(id) from ferry.events)"
    )


async def _drained(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("select count(*) from ferry.consumers where drain_to is not null") == 0  # type: ignore[no-any-return]


def _at_least(receiver: Receiver, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(receiver.received) >= n

    return check


async def _distinct(receiver: Receiver, n: int) -> bool:
    return len({r.headers["webhook-id"] for r in receiver.received}) >= n
