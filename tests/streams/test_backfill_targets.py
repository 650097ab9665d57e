"""Durable-stream readers (read_stream and SSE) and backfills: a backfill for everyone reaches them,
one targeted at a consumer or a subscription of the same stream never does."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import asyncpg
import orjson

import pgferry
from tests.helpers import StartApi
from tests.streams.sse import sse_events

ROWS = 5


async def _backfill(conn: asyncpg.Connection, **target: str) -> None:
    """A whole backfill of t for ``target`` (subscription or consumer; none: everyone), run from SQL."""
    args = "".join(f", {name} => '{value}'" for name, value in target.items())
    backfill = await conn.fetchval(f"select ferry.backfill('t'{args}, chunk_size => 2)")
    while await conn.fetchval("select state from ferry.backfill_chunk($1)", backfill) == "running":
        pass


def _until_the_live_insert(events: list[dict[str, Any]]) -> bool:
    return bool(events) and events[-1]["type"] == "INSERT"


async def test_stream_readers_get_a_backfill_for_everyone_and_none_targeted_at_a_consumer_or_a_subscription(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """The targeted backfills are written first, the one for everyone next, then a live insert: a
    reader that let a targeted READ through would have it before the insert, where it stops."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute(f"insert into t select generate_series(1, {ROWS})")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("reader")
    await conn.execute("select ferry.subscribe('hook', array['public.t'], 'http://127.0.0.1:9/hook')")
    await _backfill(conn, consumer="reader")
    await _backfill(conn, subscription="hook")
    await _backfill(conn)
    await conn.execute(f"insert into t values ({ROWS + 1})")
    targeted = await conn.fetch("select distinct target from ferry.events where target is not null")
    assert {r["target"] for r in targeted} == {"reader", "webhook:hook"}
    api = await start_api(allow_loopback=True)

    read: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        async for event in ferry.read_stream("public.t", poll_interval=0.05):
            read.append(event.payload)
            if _until_the_live_insert(read):
                break

    sse: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        asyncio.timeout(15),
        session.get(f"{api.base}/v1/streams/public.t") as response,
    ):
        assert response.status == 200, await response.text()
        async for message in sse_events(response):
            if message.event == "message":
                sse.append(orjson.loads(message.data)["payload"])
            if _until_the_live_insert(sse):
                break

    expected = [("READ", i) for i in range(1, ROWS + 1)] + [("INSERT", ROWS + 1)]
    assert [(e["type"], e["record"]["id"]) for e in read] == expected
    assert [(e["type"], e["record"]["id"]) for e in sse] == expected
