"""Stream readers: at-least-once across a killed reader, standby, reconnects, start positions."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import textwrap
from collections.abc import Awaitable

import asyncpg

import pgferry
from tests.helpers import eventually, read_all, tick

READ_ONE_AND_HANG = textwrap.dedent(
    """
    import asyncio, json, sys
    import pgferry

    async def main():
        async with pgferry.connect(sys.argv[1]) as ferry:
            async for batch in ferry.read("k", poll_interval=0.1):
                print(json.dumps({"batch": batch.id, "ids": [e.id for e in batch]}), flush=True)
                await asyncio.sleep(3600)  # killed here, before ack

    asyncio.run(main())
    """
)


async def test_reader_killed_before_ack_gets_the_same_batch_again(
    db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await ferry.register_consumer("k")
    first_ids = [await ferry.publish("s", {"n": n}) for n in range(5)]
    await tick(conn)

    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READ_ONE_AND_HANG, db_url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        seen = json.loads(await asyncio.wait_for(child.stdout.readline(), 30))
        assert seen["ids"] == first_ids
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()

    later = await ferry.publish("s", {"n": 99})
    await tick(conn)
    reader = aiter(ferry.read("k", poll_interval=0.1))
    batch = await asyncio.wait_for(anext(reader), 10)
    assert (batch.id, [e.id for e in batch]) == (seen["batch"], first_ids)
    await batch.ack()
    batch = await asyncio.wait_for(anext(reader), 10)
    assert [e.id for e in batch] == [later]
    await batch.ack()
    await reader.aclose()  # type: ignore[attr-defined]
    assert await read_all(ferry, conn, "k") == []


async def test_second_reader_of_a_consumer_stands_by(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("k")
    await ferry.publish("s", {"n": 1})
    await tick(conn)
    owner = aiter(ferry.read("k", poll_interval=0.1))
    batch = await asyncio.wait_for(anext(owner), 10)

    standby = aiter(ferry.read("k", poll_interval=0.1))
    waiting = asyncio.ensure_future(anext(standby))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "two readers read one consumer at once"

    await owner.aclose()  # type: ignore[attr-defined]  # dies without ack: the standby takes over
    again = await asyncio.wait_for(waiting, 10)
    assert again.id == batch.id
    await again.ack()
    await standby.aclose()  # type: ignore[attr-defined]


async def test_reader_reconnects_when_its_connection_is_killed(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("k")
    got: list[int] = []
    published: list[int] = []

    async def read() -> None:
        async for batch in ferry.read("k", poll_interval=0.1):
            got.extend(e.id for e in batch)
            await batch.ack()

    async def reader_backends() -> int:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "select count(*) from pg_stat_activity where application_name = 'pgferry reader'"
        )

    async def all_received() -> bool:
        await tick(conn)
        return set(published) <= set(got)

    task = asyncio.create_task(read())
    try:
        for round_ in range(3):
            published += [await ferry.publish("s", {"round": round_, "n": n}) for n in range(10)]
            await eventually(all_received, what="events before the kill")
            await eventually(lambda: _eq(reader_backends(), 1), what="reader connected")
            await conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'pgferry reader'"
            )
        published += [await ferry.publish("s", {"last": True})]
        await eventually(all_received, timeout=20, what="events after reconnecting")
    finally:
        task.cancel()
    assert set(got) == set(published)


async def _eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_start_at_beginning_or_now(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    old = await ferry.publish("s", {"old": True})
    await tick(conn)
    await ferry.register_consumer("from-start", start_at="beginning")
    await ferry.register_consumer("from-now", start_at="now")
    new = await ferry.publish("s", {"old": False})
    assert [e.id for e in await read_all(ferry, conn, "from-start")] == [old, new]
    assert [e.id for e in await read_all(ferry, conn, "from-now")] == [new]


async def test_stream_filter_and_multi_tick_batches(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("only-a", ["a"])
    expected = []
    for n in range(30):
        event_id = await ferry.publish("a" if n % 3 else "b", {"n": n})
        if n % 3:
            expected.append(event_id)
        await tick(conn)
    events = await read_all(ferry, conn, "only-a")
    assert [e.id for e in events] == expected


async def test_unknown_consumer_and_bad_start_are_clear_errors(conn: asyncpg.Connection) -> None:
    import pytest

    with pytest.raises(asyncpg.PostgresError, match="consumer 'nope' does not exist"):
        await conn.fetch("select * from ferry.next_batch('nope')")
    with pytest.raises(asyncpg.PostgresError, match="start_at must be 'now' or 'beginning'"):
        await conn.execute("select ferry.register_consumer('c', null, 'yesterday')")
    with pytest.raises(asyncpg.PostgresError, match="is not the open batch"):
        await conn.execute("select ferry.register_consumer('c')")
        await conn.execute("select ferry.finish_batch('c', 12345)")


async def test_leaving_the_loop_releases_the_consumer_without_waiting_for_the_garbage_collector(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """`break` out of `async for batch in ferry.read(...)` must close the reader's connection,
    so that the next reader of the consumer (here, in the same process) takes over at once:
    a reader kept alive by a reference cycle would hold the consumer's lock until the cyclic
    garbage collector happened to run."""
    await ferry.register_consumer("k")
    first = await ferry.publish("s", {"n": 1})
    await tick(conn)
    gc.disable()
    try:
        async for batch in ferry.read("k", poll_interval=0.1):
            assert [e.id for e in batch] == [first]
            await batch.ack()
            break
        second = await ferry.publish("s", {"n": 2})
        await tick(conn)
        reader = aiter(ferry.read("k", poll_interval=0.1))
        try:
            batch = await asyncio.wait_for(anext(reader), 10)
        finally:
            await reader.aclose()  # type: ignore[attr-defined]
        assert [e.id for e in batch] == [second]
    finally:
        gc.enable()
