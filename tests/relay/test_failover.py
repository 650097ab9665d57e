"""A failover to an asynchronous standby that had not received the last events: the promoted
server hands out no event id the old primary delivered (migration 0039, ferry.after_promotion).

A real primary and a streaming standby (pg_basebackup -R) in their own temporary directories:
the standby stops while the primary writes and delivers more events, the primary crashes, the
standby is promoted and a relay starts on it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import asyncpg
import orjson
import pytest

from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.receiver import Receiver
from pgferry.schema import install
from tests.helpers import MakeReceiver, RunningRelay, eventually

SETTINGS = {"fsync": "off", "max_connections": "50", "shared_buffers": "32MB"}


@pytest.fixture
def clusters() -> Iterator[list[EmbeddedPostgres]]:
    started: list[EmbeddedPostgres] = []
    yield started
    for cluster in started:
        cluster.destroy()


async def _publish(conn: asyncpg.Connection, names: list[str]) -> list[int]:
    return [await conn.fetchval("select ferry.publish('s', $1::text::jsonb)", orjson.dumps({"name": n}).decode())
            for n in names]  # fmt: skip


def _accepted(receiver: Receiver) -> dict[str, int]:
    """What a receiver that de-duplicates by webhook-id keeps: name -> event id, the first request of
    each webhook-id only."""
    seen: set[str] = set()
    kept: dict[str, int] = {}
    for request in receiver.received:
        webhook_id = request.headers["webhook-id"]
        if webhook_id not in seen:
            seen.add(webhook_id)
            kept[orjson.loads(request.body)["name"]] = int(webhook_id.removeprefix("evt_"))
    return kept


async def _caught_up(primary: asyncpg.Connection, standby: asyncpg.Connection) -> None:
    target = await primary.fetchval("select pg_current_wal_lsn()")

    async def replayed() -> bool:
        return bool(await standby.fetchval("select pg_last_wal_replay_lsn() >= $1", target))

    await eventually(replayed, timeout=30, what="the standby to replay the primary's WAL")


async def test_a_promoted_standby_hands_out_no_id_the_lost_primary_delivered(
    clusters: list[EmbeddedPostgres], receiver_factory: MakeReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    primary = EmbeddedPostgres(settings=SETTINGS)
    clusters.append(primary)
    await asyncio.to_thread(primary.start)
    conn = await db.connect(primary.url)
    await install(conn)
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1, batch_size => 1)", url)
    standby = await asyncio.to_thread(primary.make_standby)
    clusters.append(standby)
    await asyncio.to_thread(standby.start)

    relay = RunningRelay(primary.url)
    try:
        kept = await _publish(conn, [f"kept-{i}" for i in range(10)])
        await eventually(lambda: len(_accepted(receiver)) == 10, timeout=30, what="the first events delivered")
        replica = await db.connect(standby.url)
        try:
            await _caught_up(conn, replica)
            instance = await conn.fetchval("select instance from ferry.config")
            assert await replica.fetchval("select instance from ferry.config") == instance
            # On a standby nothing can move: nothing is done, and an operator's force is refused.
            assert await replica.fetch("select * from ferry.after_promotion()") == []
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError, match="promote it first"):
                await replica.fetch("select * from ferry.after_promotion(force => true)")
        finally:
            await replica.close()
        # The standby stops receiving: what follows is committed and delivered on the primary only.
        await asyncio.to_thread(standby.stop)
        lost = await _publish(conn, [f"lost-{i}" for i in range(100)])
        await eventually(lambda: len(_accepted(receiver)) == 110, timeout=30, what="the lost events delivered")
    finally:
        await relay.stop()
        await conn.close()
    await asyncio.to_thread(primary.stop, "immediate")  # the primary's host is gone

    await asyncio.to_thread(standby.start)
    await asyncio.to_thread(standby.promote)
    conn = await db.connect(standby.url)
    try:
        # The promoted server had replayed only the first events: its ids go on from theirs (from up
        # to 32 further: a sequence's WAL runs ahead of it), among the lost ones.
        assert await conn.fetchval("select last_value from ferry.event_id_seq") < max(lost)
        assert await conn.fetchval("select count(*) from ferry.events") == len(kept)
        caplog.set_level(logging.WARNING, logger="pgferry.log.timeline")
        relay = RunningRelay(standby.url)
        try:
            await eventually(
                lambda: any("WAL timeline 2, not 1" in r.getMessage() for r in caplog.records),
                timeout=30,
                what="the relay to notice the new timeline",
            )
            new = await _publish(conn, [f"new-{i}" for i in range(100)])
            assert min(new) > max(lost)
            assert await conn.fetchval("select instance from ferry.config") != instance
            await eventually(
                lambda: all(f"new-{i}" in _accepted(receiver) for i in range(100)),
                timeout=30,
                what="every new event kept by the de-duplicating receiver",
            )
            assert sorted(_accepted(receiver)[f"new-{i}"] for i in range(100)) == new
        finally:
            await relay.stop()
    finally:
        await conn.close()
