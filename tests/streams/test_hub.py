"""The relay's stream hub: one read of the log per tick for every follower, and followers that join
while it reads (against the real database, with the join made to happen inside the read)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

import pgferry
from pgferry import db
from pgferry.streams.hub import Follower, StreamHub
from pgferry.streams.offsets import Offset
from tests.helpers import tick


class JoinsDuringReads:
    """The hub's connection, calling ``during(query)`` just before each query goes out."""

    def __init__(self, conn: asyncpg.Connection, during: Any) -> None:
        self.conn = conn
        self.during = during

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        self.during(query)
        await asyncio.sleep(0)
        return list(await self.conn.fetch(query, *args))

    async def fetchval(self, query: str, *args: Any) -> Any:
        self.during(query)
        return await self.conn.fetchval(query, *args)


async def test_a_follower_joining_while_the_hub_reads_gets_that_range_too(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    hub = StreamHub(db_url)
    await tick(conn)
    hub.lower = int(await conn.fetchval("select max(id) from ferry.ticks"))
    first = Follower("a", 100, Offset(0, 0))
    assert hub.join(first, hub.lower)
    a = await ferry.publish("a", 1)
    b = await ferry.publish("b", 2)  # nobody follows b when the read starts
    await tick(conn)
    late = Follower("b", 100, Offset(0, 0))
    joined: list[bool] = []

    def during(query: str) -> None:
        if "batch_events" in query and not joined:
            joined.append(hub.join(late, hub.lower or 0))  # caught up to lower, joins mid-read

    other = await db.connect(db_url)
    try:
        assert await hub._step(JoinsDuringReads(other, during))
    finally:
        await other.close()
    assert joined == [True]
    assert [e.id for e in first.queue] == [a]
    assert [e.id for e in late.queue] == [b]  # not lost although the read began without its stream
    assert hub.stats.queries == 4  # range end, a's events, b's events, the ticks


async def test_a_follower_that_overflows_is_dropped_and_one_that_ends_is_done(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    hub = StreamHub(db_url)
    await tick(conn)
    hub.lower = int(await conn.fetchval("select max(id) from ferry.ticks"))
    small, ending = Follower("s", 2, Offset(0, 0)), Follower("e", 100, Offset(0, 0))
    assert hub.join(small, hub.lower) and hub.join(ending, hub.lower)
    assert not hub.join(Follower("s", 2, Offset(0, 0)), hub.lower - 1)  # behind the hub: read history first
    await ferry.publish_many([{"stream": "s", "payload": n} for n in range(3)])
    await ferry.publish("e", 1)
    await ferry.close_stream("e")
    await tick(conn)
    other = await db.connect(db_url)
    try:
        assert await hub._step(other)
    finally:
        await other.close()
    assert small.overflowed and len(small.queue) == 2
    assert ending.ended and len(ending.queue) == 2  # the event and the end marker
    assert hub.followers == {}


class CountsQueries:
    """The hub's connection, counting the queries it sends."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.sent = 0

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        self.sent += 1
        return list(await self.conn.fetch(query, *args))

    async def fetchval(self, query: str, *args: Any) -> Any:
        self.sent += 1
        return await self.conn.fetchval(query, *args)


async def test_the_hub_asks_the_database_as_much_for_500_followers_as_for_one(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    other = await db.connect(db_url)
    try:
        sent: dict[int, int] = {}
        for count in (1, 500):
            hub = StreamHub(db_url)
            await tick(conn)
            hub.lower = int(await conn.fetchval("select max(id) from ferry.ticks"))
            followers = [Follower(f"fan:{count}:{n % 100}", 100, Offset(0, 0)) for n in range(count)]
            assert all(hub.join(f, hub.lower) for f in followers)
            ids = await ferry.publish_many([{"stream": f"fan:{count}:{n % 100}", "payload": n} for n in range(300)])
            await tick(conn)
            counted = CountsQueries(other)
            while await hub._step(counted):  # every range up to the newest tick, then one that finds none
                pass
            sent[count] = counted.sent
            assert hub.stats.queries == counted.sent - 1  # (the last look found no newer tick)
            for f in followers:  # each got its own stream's events, from the one read
                assert [e.id for e in f.queue] == [i for n, i in enumerate(ids) if f.stream.endswith(f":{n % 100}")]
        assert sent[1] == sent[500] == 4, sent  # range end, the followed streams' events, the ticks; no newer tick
    finally:
        await other.close()
