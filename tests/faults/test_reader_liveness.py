"""Stream readers hold their consumer's advisory lock on one connection; with the relay's liveness
deadlines (db.Liveness), a reader cut off behind a black-holed link no longer holds it forever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

import pgferry
from pgferry.db import Liveness
from pgferry.embedded import EmbeddedPostgres
from pgferry.log.reader import ReaderSettings, StreamReader
from tests.faults.proxy import FaultProxy
from tests.helpers import tick

#: a statement gets 1 s; PostgreSQL ends a lock-holding reader session silent for 2 s
QUICK = Liveness(command_timeout=1.0, session_timeout=2.0)


async def first_batch(reader: StreamReader) -> pgferry.Batch:
    return await anext(aiter(reader))


async def test_a_black_holed_reader_releases_its_consumer_to_a_standby(
    pg: EmbeddedPostgres,
    db_url: str,
    ferry: pgferry.Ferry,
    conn: asyncpg.Connection,
    proxies: Callable[[int], Awaitable[FaultProxy]],
) -> None:
    proxy = await proxies(pg.port)
    await ferry.register_consumer("c")
    first = await ferry.publish("s", {"n": 1})
    await tick(conn)
    reader = StreamReader(proxy.url_for(db_url), ReaderSettings("c", poll_interval=0.2, liveness=QUICK))
    try:
        batch = await asyncio.wait_for(first_batch(reader), 10)
        assert [e.id for e in batch.events] == [first]
        assert await batch.ack()
        proxy.blackhole()  # the reader's session stays open on the server, holding the lock, but hears nothing

        standby = ferry.read("c", poll_interval=0.2, liveness=QUICK)
        second = await ferry.publish("s", {"n": 2})
        await tick(conn)
        started = asyncio.get_running_loop().time()
        taken = await asyncio.wait_for(first_batch(standby), 15)
        took = asyncio.get_running_loop().time() - started
        assert [e.id for e in taken.events] == [second]
        assert took < QUICK.session_timeout + 5, f"the standby waited {took:.1f} s for the lock"
        await standby.close()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.close(), 10)


async def test_a_reader_may_hold_a_batch_longer_than_the_session_timeout(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """The keepalive pings while the caller works on a batch, so only a cut-off reader is ended."""
    liveness = Liveness(command_timeout=1.0, session_timeout=1.5)
    await ferry.register_consumer("slow")
    await ferry.publish("s", {})
    await tick(conn)
    async with ferry.read("slow", poll_interval=0.2, liveness=liveness) as reader:
        batch = await asyncio.wait_for(first_batch(reader), 10)
        await asyncio.sleep(2 * liveness.session_timeout)  # the caller takes its time: that is the test
        assert await batch.ack(), "the session was ended while the batch was out"


def test_a_reader_refuses_a_session_timeout_its_own_polls_would_hit() -> None:
    with pytest.raises(ValueError, match=r"session_timeout \(1.0 s\) must be longer than its poll_interval"):
        ReaderSettings(consumer="c", poll_interval=1.0, liveness=Liveness(command_timeout=1.0, session_timeout=1.0))
