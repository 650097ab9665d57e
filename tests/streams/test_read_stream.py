"""Reading a stream by name from Python: commit order, resumable offsets, the end, retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

import pgferry
from pgferry import db
from pgferry.streams.reader import Position, StreamEvent, start
from tests.helpers import tick


async def take(events: AsyncIterator[StreamEvent], n: int, timeout: float = 10) -> list[StreamEvent]:
    got: list[StreamEvent] = []
    async with asyncio.timeout(timeout):
        async for event in events:
            got.append(event)
            if len(got) == n:
                break
    return got


async def drain(events: AsyncIterator[StreamEvent], timeout: float = 10) -> list[StreamEvent]:
    """Every event until the stream's end."""
    async with asyncio.timeout(timeout):
        return [event async for event in events]


async def test_a_reader_gets_the_committed_events_of_its_stream_in_commit_order_and_stops_at_the_end(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    slow = await db.connect(db_url)
    try:
        # The slower transaction draws the smaller id but commits last: id order is not commit order.
        slow_tx = slow.transaction()
        await slow_tx.start()
        late = await ferry.publish("chat:1", {"n": "late"}, conn=slow)
        await ferry.publish("chat:2", {"n": "other stream"})
        early = await ferry.publish("chat:1", {"n": "early"})
        rolled_back = conn.transaction()
        await rolled_back.start()
        await ferry.publish("chat:1", {"n": "never"}, conn=conn)
        await rolled_back.rollback()
        await tick(conn)
        await slow_tx.commit()
    except BaseException:
        await slow.close()
        raise
    await slow.close()
    assert late < early
    await ferry.close_stream("chat:1")
    await tick(conn)
    got = await drain(ferry.read_stream("chat:1", poll_interval=0.05))
    assert [e.payload["n"] for e in got] == ["early", "late"]
    assert [e.id for e in got] == [early, late] and got[0].offset < got[1].offset
    # Resuming after the first event's offset gives the late one, though its id is smaller.
    resumed = await drain(ferry.read_stream("chat:1", after=str(got[0].offset), poll_interval=0.05))
    assert [e.id for e in resumed] == [late]
    assert await drain(ferry.read_stream("chat:1", after=got[1].offset, poll_interval=0.05)) == []


async def test_a_reader_follows_a_stream_live_and_many_interleaved_writers_lose_nothing(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    readers = {s: asyncio.create_task(drain(ferry.read_stream(s, poll_interval=0.05), timeout=30))
               for s in ("job:a", "job:b", "job:c")}  # fmt: skip

    async def writer(number: int) -> list[tuple[str, int]]:
        own = await db.connect(db_url)
        written = []
        try:
            for i in range(30):
                stream = ("job:a", "job:b", "job:c")[(number + i) % 3]
                async with own.transaction():
                    await ferry.publish(stream, {"w": number, "i": i}, conn=own)
                    if i % 7 == 3:
                        await ferry.publish(stream, {"w": number, "i": i, "extra": True}, conn=own)
                written.append((stream, i))
        finally:
            await own.close()
        return written

    async def ticker() -> None:
        while not all(r.done() for r in readers.values()):
            await tick(conn)
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    await asyncio.gather(*(writer(n) for n in range(4)))
    for stream in readers:
        await ferry.close_stream(stream)
    got = {s: await r for s, r in readers.items()}
    await ticking  # it stops once the readers are done; cancelling it could leave conn mid-query
    for stream, events in got.items():
        ids = await conn.fetch("select id from ferry.events where stream = $1 and headers is null", stream)
        assert sorted(e.id for e in events) == sorted(r["id"] for r in ids), stream  # every one, once
        assert [e.offset for e in events] == sorted(e.offset for e in events)
        for w in range(4):  # one writer's events in the order it committed them
            mine = [e.payload["i"] for e in events if e.payload["w"] == w]
            assert mine == sorted(mine)


async def test_a_closed_stream_refuses_publishes_and_its_end_is_where_readers_stop(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    first = await ferry.publish("answer:7", {"token": "Hello"})
    end = await ferry.close_stream("answer:7")
    assert await ferry.close_stream("answer:7") == end  # again: the same end
    with pytest.raises(pgferry.PgferryError) as refused:
        await ferry.publish("answer:7", {"token": "late"})
    assert "stream 'answer:7' is closed" in str(refused.value)
    with pytest.raises(asyncpg.PostgresError) as many:
        await conn.execute("""select ferry.publish_many(array['x', 'answer:7'], array['{}', '{}']::jsonb[])""")
    assert many.value.sqlstate == "55000"
    for name in ("pgferry-control", "PgFerry-Control"):  # header names have no case (the second passed)
        with pytest.raises(asyncpg.PostgresError) as reserved:
            await conn.execute(f"""select ferry.publish('y', '{{}}', headers => '{{"{name}": "end"}}')""")
        assert reserved.value.sqlstate == "22023"
        with pytest.raises(asyncpg.PostgresError) as reserved:
            await conn.execute(
                f"""select ferry.publish_many(array['y', 'y'], array['{{}}', '{{}}']::jsonb[],
                                              headers => array[null, '{{"{name}": "end"}}']::jsonb[])"""
            )
        assert reserved.value.sqlstate == "22023"
    await conn.execute("create table orders (id int primary key)")
    await conn.execute("select ferry.capture_table('orders')")
    with pytest.raises(asyncpg.PostgresError, match="written by a captured table"):
        await conn.execute("select ferry.close_stream('public.orders')")
    await tick(conn)
    assert [e.id for e in await drain(ferry.read_stream("answer:7", poll_interval=0.05))] == [first]


async def test_an_offset_older_than_retention_says_the_oldest_one_left(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.publish("log:1", {"n": 1})
    await tick(conn)
    (first,) = await take(ferry.read_stream("log:1", poll_interval=0.05), 1)
    for _ in range(3):  # rotate: partition 0 closes and, with no consumer holding it, is truncated
        await conn.fetchval("select ferry.maintain()")
        await ferry.publish("log:1", {"n": 2})
        await tick(conn)
    await conn.fetchval("select ferry.maintain()")
    assert await conn.fetchval("select count(*) from ferry.events where id = $1", first.id) == 0  # dropped
    with pytest.raises(pgferry.OffsetExpired) as expired:
        await take(ferry.read_stream("log:1", after=first.offset, poll_interval=0.05), 1)
    oldest = expired.value.oldest
    assert oldest.tick > first.offset.tick and f"oldest retained, {oldest}" in str(expired.value)
    rest = await take(ferry.read_stream("log:1", after=oldest, poll_interval=0.05), 1)
    assert rest[0].payload == {"n": 2}
    with pytest.raises(pgferry.BadOffset):
        await take(ferry.read_stream("log:1", after="yesterday"), 1)


async def test_an_offset_ahead_of_the_log_is_refused_not_waited_for(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """As after a restore from an older backup: waiting for the tick would skip, unseen, all
    that is committed until then."""
    await ferry.publish("log:2", {"n": 1})
    newest = await tick(conn)
    assert newest is not None
    with pytest.raises(pgferry.OffsetAhead, match=f"newest position is {newest}-0") as ahead:
        await take(ferry.read_stream("log:2", after=f"{newest + 1000}-5", poll_interval=0.05), 1)
    assert isinstance(ahead.value, pgferry.PgferryError)
    (event,) = await take(ferry.read_stream("log:2", after=f"{newest}-0", poll_interval=0.05), 1)
    assert event.payload == {"n": 1}  # the newest position it names is one to read after
    with pytest.raises(pgferry.PgferryError, match="stream must be a non-empty name"):  # it waited forever
        await take(ferry.read_stream(""), 1)


async def test_a_closed_stream_that_retention_dropped_whole_ends_at_once_for_a_reader_from_its_start(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await ferry.publish("answer:9", "a")
    await ferry.close_stream("answer:9")
    await ferry.publish("open:1", "b")
    for _ in range(4):
        await tick(conn)
        await conn.fetchval("select ferry.maintain()")
        await ferry.publish("other", 1)
    assert await conn.fetchval("select count(*) from ferry.events where stream in ('answer:9', 'open:1')") == 0
    assert await drain(ferry.read_stream("answer:9", poll_interval=0.05), timeout=2) == []
    # An open stream whose events were dropped is followed from the oldest retained tick on.
    assert await start(conn, "open:1", None) is not None


async def test_a_reader_from_the_beginning_starts_where_the_stream_catalog_says_its_first_event_is(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await ferry.publish("old", 1)
    await tick(conn)
    await conn.fetchval("select ferry._catalog_streams()")
    oldest = (await started(conn, "old")).lower  # catalogued before any scan had a tick: the oldest
    scanned = await conn.fetchval("select scanned_tick from ferry.stream_scan")
    await tick(conn)
    first = await ferry.publish("answer:1", "a")
    await tick(conn)
    await conn.fetchval("select ferry._catalog_streams()")
    assert await conn.fetchval("select first_tick from ferry.streams where stream = 'answer:1'") == scanned
    assert (await started(conn, "answer:1")).lower == scanned > oldest
    # Not catalogued yet (written since the last scan): it starts at the last scanned tick.
    second = await ferry.publish("answer:2", "b")
    await tick(conn)
    newest = await conn.fetchval("select scanned_tick from ferry.stream_scan")
    assert (await started(conn, "answer:2")).lower == newest > scanned
    for stream, event in (("answer:1", first), ("answer:2", second)):
        await ferry.close_stream(stream)
        await tick(conn)
        assert [e.id for e in await drain(ferry.read_stream(stream, poll_interval=0.05))] == [event]
    # A scan with no new tick changes nothing.
    assert await conn.fetchval("select ferry._catalog_streams()") >= 0
    assert await conn.fetchval("select ferry._catalog_streams()") == 0


async def started(conn: asyncpg.Connection, stream: str) -> Position:
    position = await start(conn, stream, None)
    assert position is not None
    return position


async def test_concurrent_closes_write_one_end_marker_and_all_return_its_id(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """Each wrote a marker of its own and returned its id; readers stopped at one of them."""
    await conn.execute("select ferry.publish('race:1', '1')")

    async def close() -> int:
        other = await asyncpg.connect(db_url)
        try:
            async with other.transaction():
                end = await other.fetchval("select ferry.close_stream('race:1')")
                await asyncio.sleep(0.3)  # the others come while this one is open
                return int(end)
        finally:
            await other.close()

    ends = await asyncio.gather(*(close() for _ in range(5)))
    markers = await conn.fetchval(
        "select count(*) from ferry.events where stream = 'race:1' and headers ? 'pgferry-control'"
    )
    assert len(set(ends)) == 1 and markers == 1
    assert await conn.fetchval("select end_event from ferry.closed_streams where stream = 'race:1'") == ends[0]


async def test_a_reader_whose_connection_is_terminated_reconnects_with_no_gap_and_no_duplicate(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    got: list[StreamEvent] = []
    arrived = asyncio.Event()

    async def read() -> None:
        async for event in ferry.read_stream("cut:1", poll_interval=0.05):
            got.append(event)
            arrived.set()

    async def terminate() -> None:
        """End the reader's backend, as an operator or a failover would."""
        ended = await conn.fetchval(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity"
            " where application_name = 'pgferry stream reader' and datname = current_database()"
        )
        assert ended == 1

    written = [await ferry.publish("cut:1", n) for n in range(3)]
    await tick(conn)
    reading = asyncio.create_task(read())
    while len(got) < 3:
        await asyncio.wait_for(arrived.wait(), 10)
        arrived.clear()
    await terminate()  # while it waits for the next tick
    written += [await ferry.publish("cut:1", n) for n in range(3, 6)]  # while it is away, or coming back
    await tick(conn)
    while len(got) < 6:
        await asyncio.wait_for(arrived.wait(), 10)
        arrived.clear()
    await terminate()
    async with conn.transaction():  # committed in one tick with the end
        written += [await ferry.publish("cut:1", n, conn=conn) for n in range(6, 9)]
        await ferry.close_stream("cut:1", conn=conn)
    await tick(conn)
    await asyncio.wait_for(reading, 15)
    assert [e.id for e in got] == written  # every one, once, in order
    assert [e.offset for e in got] == sorted(e.offset for e in got)


async def test_a_reader_registers_nothing_and_holds_no_event_back_from_retention(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    consumers = await conn.fetchval("select count(*) from ferry.consumers")
    first = await ferry.publish("pinless", 1)
    await tick(conn)
    reader = ferry.read_stream("pinless", poll_interval=0.05)
    try:
        assert (await anext(reader)).id == first  # open, connected, and positioned on that tick
        assert await conn.fetchval("select count(*) from ferry.consumers") == consumers
        for _ in range(4):  # rotate as if nobody read: the reader's partition is truncated
            await conn.fetchval("select ferry.maintain()")
            await ferry.publish("other", 1)
            await tick(conn)
        assert await conn.fetchval("select count(*) from ferry.events where id = $1", first) == 0
        with pytest.raises(pgferry.OffsetExpired):  # the reader finds out when it reads on
            await asyncio.wait_for(anext(reader), 10)
    finally:
        await reader.aclose()  # type: ignore[attr-defined]


async def test_a_reader_gets_a_payload_nested_deeper_than_orjson_decodes_as_its_json_text(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    text = "[" * 2_000 + "]" * 2_000
    await conn.execute("select ferry.publish('deep', $1::text::jsonb)", text)
    await ferry.publish("deep", {"after": True})
    await ferry.close_stream("deep")
    await tick(conn)
    got = await drain(ferry.read_stream("deep", poll_interval=0.05))
    assert isinstance(got[0].payload, pgferry.RawJSON) and got[0].payload == text
    assert got[1].payload == {"after": True}
