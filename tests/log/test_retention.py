"""Retention: partitions rotate and are truncated whole, only once every consumer passed them."""

from __future__ import annotations

import asyncpg

import pgferry
from pgferry import db
from tests.helpers import read_all, tick


async def maintain(conn: asyncpg.Connection) -> list[str]:
    return list(await conn.fetchval("select ferry.maintain()"))


async def partition_of(conn: asyncpg.Connection, event_id: int) -> int:
    return await conn.fetchval("select part from ferry.events where id = $1", event_id)  # type: ignore[no-any-return]


async def test_truncates_only_after_every_consumer_passed(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.register_consumer("fast")
    await ferry.register_consumer("slow")
    first = [await ferry.publish("s", {"n": n}) for n in range(5)]
    assert await maintain(conn) == ["writers moved to partition 1"]
    second = [await ferry.publish("s", {"n": n}) for n in range(5, 10)]
    assert {await partition_of(conn, i) for i in first} == {0}
    assert {await partition_of(conn, i) for i in second} == {1}
    assert "partition 0 closed" in await maintain(conn)

    assert [e.id for e in await read_all(ferry, conn, "fast")] == first + second
    await tick(conn)
    assert "partition 0 truncated" not in await maintain(conn), "truncated before 'slow' read it"

    assert [e.id for e in await read_all(ferry, conn, "slow")] == first + second
    await tick(conn)
    await read_all(ferry, conn, "fast")
    await read_all(ferry, conn, "slow")
    assert "partition 0 truncated" in await maintain(conn)
    assert await conn.fetchval("select count(*) from ferry.events_0") == 0
    assert await conn.fetchval("select count(*) from ferry.events") == 0  # both consumers read everything

    third = await ferry.publish("s", {"n": 10})
    assert [e.id for e in await read_all(ferry, conn, "slow")] == [third]


async def test_repeatable_read_writer_with_old_snapshot_follows_the_rotation(
    db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """The partition pointer is non-transactional, so an old snapshot cannot write into a closed partition."""
    await conn.execute("update ferry.config set rotation_interval = '0 s'")
    await ferry.register_consumer("c")
    writer = await db.connect(db_url)
    try:
        tx = writer.transaction(isolation="repeatable_read")
        await tx.start()
        await writer.fetchval("select count(*) from ferry.partitions")  # snapshot taken before the rotation
        await ferry.publish("s", {"before": True})
        assert await maintain(conn) == ["writers moved to partition 1"]
        late = await ferry.publish("s", {"late": True}, conn=writer)
        assert await partition_of(writer, late) == 1
        await tx.commit()
    finally:
        await writer.close()
    assert [e.payload for e in await read_all(ferry, conn, "c")] == [{"before": True}, {"late": True}]


async def test_without_consumers_history_follows_the_newest_tick(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.publish("s", {})
    await maintain(conn)
    await maintain(conn)
    await tick(conn)
    assert "partition 0 truncated" in await maintain(conn)


async def test_a_closed_partition_is_kept_rotation_interval_after_it_stopped_taking_writes(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Stream readers hold no cursor: an event written just before a rotation must not be dropped
    seconds later (seen under a test suite older than 5 minutes: a reader's history vanished)."""
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.publish("s", {})
    assert "writers moved to partition 1" in await maintain(conn)
    await conn.execute("update ferry.config set rotation_interval = '1 hour'")
    for _ in range(3):
        await tick(conn)
        assert not any("truncated" in m for m in await maintain(conn))
    await conn.execute("update ferry.partitions set closed_at = now() - interval '61 minutes' where part = 0")
    await tick(conn)
    assert "partition 0 truncated" in await maintain(conn)


async def test_old_ticks_are_removed(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("c")
    for n in range(20):
        await ferry.publish("s", {"n": n})
        await tick(conn)
    await read_all(ferry, conn, "c")
    await maintain(conn)
    cursor = await conn.fetchval("select tick_id from ferry.consumers where name = 'c'")
    oldest = await conn.fetchval("select min(id) from ferry.ticks")
    assert oldest == min(cursor, 1)  # tick 1 stays: partition 0 still holds events from the start
