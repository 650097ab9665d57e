"""Broker sinks against real servers: NATS JetStream (nats-server) and Redis Streams (redis-server).

Each test starts its own broker on 127.0.0.1. What the broker holds at the end
is read with the brokers' own clients (nats-py, redis-py), never through
pgferry's sink code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import signal
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import asyncpg
import nats
import orjson
import pytest
import redis.asyncio
import trustme
from nats.js.api import DiscardPolicy, StreamConfig

import pgferry
from pgferry.bench.brokers import NatsServer, RedisServer, nats_server_binary, redis_server_binary
from pgferry.delivery import jetstream, redis_streams
from pgferry.delivery.addresses import AddressPolicy, parse_networks
from pgferry.delivery.brokers import Brokers, BrokerUnreachable, PublishRefused
from pgferry.delivery.context import DeliveryContext
from pgferry.delivery.destinations import NatsDestination, Template
from pgferry.delivery.jetstream import JetStreamSink
from pgferry.delivery.model import OutEvent
from pgferry.delivery.redis_streams import RedisStreamsSink
from pgferry.ops import inspect
from tests.helpers import FAST, FAST_RETRY, RelayProcess, RunningRelay, cli, eventually, scrape, subscription, value

needs_redis = pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
async def js(nats_server: NatsServer) -> AsyncIterator[Any]:
    client = await nats.connect(nats_server.url)
    yield client.jetstream()
    await client.close()


def redis_client(port: int, **options: Any) -> Any:
    """redis-py's client, typed loosely: its replies' types depend on decode_responses."""
    return redis.asyncio.Redis(port=port, decode_responses=True, **options)


@contextlib.asynccontextmanager
async def nats_with(config: str) -> AsyncIterator[tuple[NatsServer, Any]]:
    """A nats-server of its own with ``config`` (e.g. a small max_payload), and a JetStream client."""
    server = NatsServer(config)
    server.start()
    try:
        client = await nats.connect(server.url)
        try:
            yield server, client.jetstream()
        finally:
            await client.close()
    finally:
        server.close()


async def stream_messages(js: Any, stream: str) -> list[Any]:
    """Every message the JetStream stream holds, in stream order (an ordered consumer: get_msg,
    one request per message, took 5 s for the kill test's 9,600)."""
    count = (await js.stream_info(stream)).state.messages
    if not count:
        return []
    sub = await js.subscribe(">", stream=stream, ordered_consumer=True)
    try:
        return [await sub.next_msg(timeout=10) for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def test_jetstream_gets_each_event_once_on_its_key_subject(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    await js.add_stream(name="ORDERS", subjects=["orders.>"])
    await ferry.subscribe("to-nats", ["s"], f"{nats_server.url}/orders.{{key}}", batch_size=10, ordered=True)
    ids = [await ferry.publish("s", {"n": n}, key=f"k.{n % 3}", headers={"trace": f"t{n}"}) for n in range(30)]
    keyless = await ferry.publish("s", {"n": "none"})

    async def stored() -> bool:
        return bool((await js.stream_info("ORDERS")).state.messages >= 31)

    await eventually(stored, what="31 messages in JetStream")
    messages = await stream_messages(js, "ORDERS")
    assert len(messages) == 31
    by_id = {m.headers["webhook-id"]: m for m in messages}
    assert set(by_id) == {f"evt_{i}" for i in [*ids, keyless]}
    first = by_id[f"evt_{ids[0]}"]
    assert first.subject == "orders.k%2E0"  # the key is one token: its dot is encoded
    assert orjson.loads(first.data) == {"n": 0}
    assert first.headers["pgferry-key"] == "k.0" and first.headers["pgferry-stream"] == "s"
    assert first.headers["trace"] == "t0"
    instance = await conn.fetchval(  # the install's name (migration 0034) and the database's
        "select instance || '.' || (select oid from pg_database where datname = current_database()) from ferry.config"
    )
    assert first.headers["Nats-Msg-Id"] == f"{instance}/to-nats/evt_{ids[0]}"
    assert by_id[f"evt_{keyless}"].subject == "orders._"
    for k in range(3):  # per-key order, as JetStream stored them
        of_key = [orjson.loads(m.data)["n"] for m in messages if m.subject == f"orders.k%2E{k}"]
        assert of_key == list(range(k, 30, 3))
    await eventually(recorded(conn, "to-nats", 31), what="31 attempts recorded")
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is not null") == 0


async def test_many_jetstream_subscriptions_share_one_connection_and_each_message_is_stored_once(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """300 subscriptions publish their chunks at once through the relay's one connection to the
    server: each acknowledgement must reach its own chunk's message."""
    await js.add_stream(name="FAN", subjects=["fan.>"])
    for n in range(300):
        await ferry.subscribe(f"fan{n}", ["s"], f"{nats_server.url}/fan.{n}.{{key}}", batch_size=4)
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}, "key": str(n)} for n in range(10)])

    async def stored() -> bool:
        return bool((await js.stream_info("FAN")).state.messages >= 3000)

    await eventually(stored, timeout=60, what="3,000 messages in JetStream")
    messages = await stream_messages(js, "FAN")
    assert len(messages) == len({m.headers["Nats-Msg-Id"] for m in messages}) == 3000
    for m in messages:  # each on its subscription's subject, for its own event
        sub = m.headers["Nats-Msg-Id"].split("/")[1].removeprefix("fan")
        assert m.subject == f"fan.{sub}.{orjson.loads(m.data)['n']}"

    async def acknowledged() -> bool:  # a chunk handed another's acknowledgements waits for its own in vain
        return bool(
            await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is null") == 3000
        )

    await eventually(acknowledged, timeout=60, what="3,000 acknowledged attempts")
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is not null") == 0


async def test_non_ascii_header_values_arrive_percent_encoded_with_a_marker_not_as_raw_utf8(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """`pgferry-stream` of stream `ü.x` and an event's `x-u: héllo` went out as raw UTF-8, which
    nats-py consumers read as garbage (outside probe); the key was percent-encoded already."""
    await js.add_stream(name="U", subjects=["u.>"])
    await ferry.subscribe("u", ["ü.x", "plain"], f"{nats_server.url}/u.{{key}}")
    await ferry.publish("ü.x", {"n": 1}, key="k", headers={"x-u": "héllo", "x-a": "ascii"})
    await ferry.publish("plain", {"n": 2}, key="k")
    await eventually(lambda: _equals(_stored(js, "U"), 2), what="2 messages")
    first, second = (m.headers for m in await stream_messages(js, "U"))
    assert first["pgferry-stream"] == "%C3%BC.x" and first["pgferry-stream-encoding"] == "percent", first
    assert first["x-u"] == "h%C3%A9llo" and first["pgferry-encoded-headers"] == "x-u", first
    assert first["x-a"] == "ascii" and unquote(first["x-u"]) == "héllo" and unquote(first["pgferry-stream"]) == "ü.x"
    assert second["pgferry-stream"] == "plain" and "pgferry-stream-encoding" not in second, second
    assert "pgferry-encoded-headers" not in second


async def test_headers_over_jetstreams_64k_are_too_large_and_dead_at_once_and_the_key_goes_on(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """JetStream refuses a message whose header block passes 65,535 bytes ("header size exceeds
    maximum allowed of 64k", err_code 10097): it was retried as `rejected`, holding its key back
    for the whole retry plan (outside probe). docs/sinks.md: too_large covers the headers."""
    await js.add_stream(name="HDR", subjects=["hdr.>"])
    await ferry.subscribe("hdr", ["s"], f"{nats_server.url}/hdr.{{key}}", ordered=True, batch_size=5)
    big = await ferry.publish("s", {"n": 0}, key="k", headers={"x-big": "y" * 70_000})
    after = await ferry.publish("s", {"n": 1}, key="k")
    await eventually(lambda: _equals(_stored(js, "HDR"), 1), what="the next event of the key")
    assert [m.headers["webhook-id"] for m in await stream_messages(js, "HDR")] == [f"evt_{after}"]
    attempts = await conn.fetch("select error_class, error from ferry.attempt_history() where event_id = $1", big)
    assert [r[0] for r in attempts] == ["too_large"], attempts  # dead at once, not retried
    assert "header" in attempts[0][1] and "65535" in attempts[0][1], attempts[0][1]
    assert await conn.fetchval("select event_id from ferry.dead_letters") == big
    # and what JetStream itself answers to one (a block just over: the relay's check is the same limit)
    answer = PublishRefused(False, 10097, "header size exceeds maximum allowed of 64k")
    message = jetstream.Message("hdr.k", b"{}", {}, b"h" * 65_536)
    dest = NatsDestination("127.0.0.1", nats_server.port, Template("hdr.k"))
    refused = jetstream._explain(answer, message, dest, 1 << 20, 1.0, 0.0)
    assert refused.error_class == "too_large" and "header size exceeds" in (refused.error or ""), refused


async def test_every_header_publish_accepts_is_framed_for_jetstream_and_nothing_is_dead_lettered(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """Numbers, null, a CR LF in a value, names with a space, a colon or none: ferry.publish takes
    them, Redis stored them, and JetStream dead-lettered each after one attempt as bad_request,
    which no `dlq replay` could ever fix (outside probe)."""
    await js.add_stream(name="ANY", subjects=["any.>"])
    await ferry.subscribe("any", ["s"], f"{nats_server.url}/any.{{key}}", ordered=True)
    sent: list[dict[str, Any]] = [
        {"x-n": 5, "x-null": None, "x-t": True, "x-o": {"a": [1, "é"]}},
        {"x-crlf": "a\r\nb", "x-ctl": "\x01\x1b"},
        {"bad name": "v", "a:b": "w", "": "e", "x-ok": "1", "é": "\r\n"},
    ]
    sent[0] |= {"x-big": 12345678901234567890123, "x-f": 1.10}  # beyond orjson: published in SQL
    ids = [await conn.fetchval("select ferry.publish('s', $1::text::jsonb, 'k', $2::text::jsonb)", f'{{"n": {n}}}',
                               json.dumps(h).replace("1.1}", "1.10}")) for n, h in enumerate(sent)]  # fmt: skip
    await eventually(lambda: _equals(_stored(js, "ANY"), 3), what="3 messages")
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is not null") == 0
    first, second, third = (m.headers for m in await stream_messages(js, "ANY"))
    assert [first["webhook-id"], second["webhook-id"], third["webhook-id"]] == [f"evt_{i}" for i in ids]
    assert (first["x-n"], first["x-null"], first["x-t"]) == ("5", "null", "true"), first
    # numbers exactly as stored (orjson read the big one as a float: 1.2345678901234568e+22; a second
    # outside probe), and the names listed without spaces, as the docs say
    assert (first["x-big"], first["x-f"]) == ("12345678901234567890123", "1.10"), first
    assert sorted(first["pgferry-json-headers"].split(",")) == ["x-big", "x-f", "x-n", "x-null", "x-o", "x-t"], first
    assert orjson.loads(unquote(first["x-o"])) == {"a": [1, "é"]} and "x-o" in first["pgferry-encoded-headers"]
    assert unquote(second["x-crlf"]) == "a\r\nb" and unquote(second["x-ctl"]) == "\x01\x1b", second
    assert sorted(second["pgferry-encoded-headers"].split(",")) == ["x-crlf", "x-ctl"], second
    assert third["x-ok"] == "1" and "bad name" not in third, third
    other = third["pgferry-other-headers"]
    if "pgferry-other-headers" in third.get("pgferry-encoded-headers", ""):
        other = unquote(other)
    assert orjson.loads(other) == {"bad name": "v", "a:b": "w", "": "e", "é": "\r\n"}, third


def recorded(conn: asyncpg.Connection, subscription: str, count: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        got = await conn.fetchval("select count(*) from ferry.attempt_history() where subscription = $1", subscription)
        return bool(got == count)

    return check


@needs_redis
async def test_redis_gets_each_event_once_on_its_key_stream(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    url = f"{redis_server.url}/3?stream=orders:{{key}}&maxlen=1000"
    await ferry.subscribe("to-redis", ["s"], url, batch_size=10, ordered=True)
    ids = [await ferry.publish("s", {"n": n}, key=f"k {n % 3}", headers={"trace": f"t{n}"}) for n in range(30)]
    keyless = await ferry.publish("s", {"n": "none"})
    client = redis_client(redis_server.port, db=3)

    async def stored() -> bool:
        lengths = [await client.xlen(k) for k in ("orders:k 0", "orders:k 1", "orders:k 2", "orders:_")]
        return bool(sum(lengths) >= 31)

    await eventually(stored, what="31 entries in Redis")
    entries = {k: await client.xrange(k) for k in ("orders:k 0", "orders:k 1", "orders:k 2", "orders:_")}
    assert sum(map(len, entries.values())) == 31
    first = entries["orders:k 0"][0][1]
    assert first["webhook-id"] == f"evt_{ids[0]}" and first["stream"] == "s" and first["key"] == "k 0"
    assert orjson.loads(first["payload"]) == {"n": 0} and orjson.loads(first["headers"]) == {"trace": "t0"}
    created = await conn.fetch("select id, created_at from ferry.events where id = any($1)", [ids[0], keyless])
    stamps = {r["id"]: r["created_at"] for r in created}
    assert datetime.fromisoformat(first["created_at"]) == stamps[ids[0]]
    assert datetime.fromisoformat(entries["orders:_"][0][1]["created_at"]) == stamps[keyless]
    assert "key" not in entries["orders:_"][0][1] and entries["orders:_"][0][1]["webhook-id"] == f"evt_{keyless}"
    for k in range(3):  # per-key order, as Redis stored them
        assert [orjson.loads(f["payload"])["n"] for _, f in entries[f"orders:k {k}"]] == list(range(k, 30, 3))
    await eventually(recorded(conn, "to-redis", 31), what="31 attempts recorded")
    await client.aclose()


@needs_redis
async def test_a_redis_entry_over_the_limit_in_bytes_is_dead_lettered_with_the_reason(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """The entry's size was counted in characters: 600 two-byte characters passed a 1,000-byte
    limit and were appended."""
    await conn.execute("update ferry.config set max_body_bytes = 1000")  # read at relay start
    await ferry.subscribe("sized", ["s"], f"{redis_server.url}/0?stream=sized")
    big = await ferry.publish("s", {"p": "é" * 600})  # ~680 characters, ~1,280 bytes
    fine = await ferry.publish("s", {"p": "e" * 600})
    client = redis_client(redis_server.port)
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: _equals(client.xlen("sized"), 1), what="the small event")
        await eventually(lambda: _equals(conn.fetchval("select count(*) from ferry.dead_letters"), 1), what="a letter")
    finally:
        await relay.stop()
    letter = await conn.fetchrow("select event_id, last_error from ferry.dead_letters")
    assert letter["event_id"] == big, letter
    assert f"entry of event {big} is 12" in letter["last_error"], letter  # bytes, not ~680 characters
    assert "over the relay's limit of 1000 (ferry.config.max_body_bytes)" in letter["last_error"], letter
    attempts = await conn.fetch("select error_class from ferry.attempt_history() where event_id = $1", big)
    assert [r[0] for r in attempts] == ["too_large"]  # dead at once, not retried
    assert (await client.xrange("sized"))[0][1]["webhook-id"] == f"evt_{fine}"
    await client.aclose()


ACL_USER = (
    "relay_acl on >s3cret ~acl:* ~pgferry:dedup:* "
    "+auth +select +ping +evalsha +script|load +time +hmget +hset +expire +xadd"
)


@needs_redis
async def test_two_databases_subscriptions_of_one_name_publishing_into_one_broker_lose_nothing(
    db_url: str, second_db_url: str, conn: asyncpg.Connection, nats_server: NatsServer, js: Any,
    redis_server: RedisServer,
) -> None:  # fmt: skip
    """Two shards (the second made from the first's template, as CREATE DATABASE ... TEMPLATE
    does), each with the subscriptions `bus` (JetStream) and `cache` (Redis) into one stream:
    their event ids overlap, and each dropped the other's events as duplicates while recording
    them delivered (outside probe: 5 of 10 in neither broker)."""
    await js.add_stream(name="SHARDS", subjects=["shard.>"])
    for n, url in enumerate((db_url, second_db_url)):
        async with pgferry.connect(url) as ferry:
            await ferry.subscribe("bus", ["s"], f"{nats_server.url}/shard.{n}", batch_size=5)
            await ferry.subscribe("cache", ["s"], f"{redis_server.url}/0?stream=shard:{n}", batch_size=5)
            assert [await ferry.publish("s", {"shard": n, "k": k}) for k in range(3)] == [1, 2, 3]
    relays = [RunningRelay(db_url), RunningRelay(second_db_url)]
    client = redis_client(redis_server.port)
    try:
        await eventually(lambda: _equals(client.xlen("shard:0"), 3), what="shard 0's 3 entries")
        await eventually(lambda: _equals(client.xlen("shard:1"), 3), what="shard 1's 3 entries")

        async def stored() -> bool:
            return bool((await js.stream_info("SHARDS")).state.messages == 6)

        await eventually(stored, what="6 messages in JetStream")
    finally:
        for relay in relays:
            await relay.stop()
        await client.aclose()


@needs_redis
async def test_a_redis_user_allowed_what_docs_sinks_lists_appends(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """docs/sinks.md's ACL line, as it is written there (it listed HEXISTS for HMGET and named no
    keys, and a user set up by it failed every event; outside probe)."""
    client = redis_client(redis_server.port)
    await client.execute_command("ACL", "SETUSER", *ACL_USER.split())
    await ferry.subscribe("acl", ["s"], f"{redis_server.url}/0?stream=acl:{{key}}")
    await ferry.set_credentials("acl", {"user": "relay_acl", "password": "s3cret"})
    for n in range(3):
        await ferry.publish("s", {"n": n}, key="k")
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: _equals(client.xlen("acl:k"), 3), what="3 entries")
    finally:
        await relay.stop()
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    await client.aclose()


@needs_redis
@pytest.mark.parametrize("missing", ["+hset", "+expire"])
async def test_a_redis_user_not_allowed_to_write_the_marks_stores_nothing_and_is_dead_lettered(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer, missing: str
) -> None:
    """The script appended before it wrote the marks, and a script failing part-way keeps what it
    wrote: without HSET each event was stored at every try (6-8 copies) and still dead-lettered;
    without EXPIRE once, with a mark hash that never expired (outside probe). docs/sinks.md: a user
    allowed less fails each event with NOPERM, retried and then dead-lettered."""
    client = redis_client(redis_server.port)
    await client.execute_command("ACL", "SETUSER", *ACL_USER.replace(f" {missing}", "").split())
    await ferry.subscribe("acl", ["s"], f"{redis_server.url}/0?stream=acl:{{key}}", batch_size=5, max_attempts=3,
                          retry_base_ms=20, retry_max_ms=100)  # fmt: skip
    await ferry.set_credentials("acl", {"user": "relay_acl", "password": "s3cret"})
    for n in range(4):
        await ferry.publish("s", {"n": n}, key=f"k{n % 2}")
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: _equals(conn.fetchval("select count(*) from ferry.dead_letters"), 4), what="4 dead")
    finally:
        await relay.stop()
    errors = [r[0] for r in await conn.fetch("select last_error from ferry.dead_letters")]
    assert all("NOPERM" in e or "can't run this command" in e for e in errors), errors  # (Redis 7.0's words)
    assert await conn.fetchval("select count(*) from ferry.attempts where subscription = 'acl'") >= 8  # retried
    assert await client.keys("acl:*") == []  # not one entry stored
    for marks in await client.keys("pgferry:dedup:*"):
        assert await client.ttl(marks) > 0, marks
    await client.aclose()


@needs_redis
async def test_redis_dedup_windows_are_the_servers_so_relays_with_skewed_clocks_append_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The windows were the relay's own clock: a chunk appended by a relay an hour ahead and
    re-sent by one on time (the first died before its bookkeeping) was stored twice."""
    url = f"{redis_server.url}/0?stream=skew"
    sub = subscription(name="skew", url=url)
    ctx = DeliveryContext(pool=None, http=None, global_limit=None)  # type: ignore[arg-type]
    sink = RedisStreamsSink(sub, ctx)
    events = [OutEvent(n, "s", "k", orjson.dumps({"n": n}).decode(), None, datetime.now(UTC)) for n in (1, 2)]
    wall = time.time
    try:
        for skew in (3600.0, 0.0, -3600.0, 0.0):  # relays on three hosts, or one whose clock jumped
            clock = types.SimpleNamespace(time=lambda skew=skew: wall() + skew, perf_counter=time.perf_counter)
            monkeypatch.setattr(redis_streams, "time", clock)
            result = await sink.send(events, sink.prepare(events), None, fresh=False)
            assert result.error_class is None, result
    finally:
        await ctx.brokers.close()
    client = redis_client(redis_server.port)
    assert [f["webhook-id"] for _, f in await client.xrange("skew")] == ["evt_1", "evt_2"]
    await client.aclose()


@needs_redis
async def test_redis_chunks_resent_overlapping_or_broken_midway_append_each_event_once(
    redis_server: RedisServer,
) -> None:
    """APPEND_ONCE looks the chunk's marks up and writes them once per chunk: an event seen in an
    earlier chunk, twice in one chunk, or before a stream that refused it, is appended once."""
    url = f"{redis_server.url}/0?stream=once:{{key}}"
    ctx = DeliveryContext(pool=None, http=None, global_limit=None)  # type: ignore[arg-type]
    sink = RedisStreamsSink(subscription(name="once", url=url), ctx)
    client = redis_client(redis_server.port)

    def events(*ids: int, key: str = "a") -> list[OutEvent]:
        return [OutEvent(n, "s", key, orjson.dumps({"n": n}).decode(), None, datetime.now(UTC)) for n in ids]

    async def send(chunk: list[OutEvent]) -> str | None:
        return (await sink.send(chunk, sink.prepare(chunk), None, fresh=False)).error

    try:
        assert await send(events(1, 2, 3)) is None
        assert await send(events(2, 3, 4, 4, 5)) is None  # resent, and one event twice in a chunk
        await client.set("once:bad", "a string, not a stream")
        error = await send([*events(6, 7), *events(8, key="bad"), *events(9)])
        assert error is not None and "'once:bad'" in error and "WRONGTYPE" in error
        await client.delete("once:bad")
        assert await send([*events(6, 7), *events(8, key="bad"), *events(9)]) is None
    finally:
        await ctx.brokers.close()
    ids = [f["webhook-id"] for _, f in await client.xrange("once:a")]
    assert ids == [f"evt_{n}" for n in (1, 2, 3, 4, 5, 6, 7, 9)]
    assert [f["webhook-id"] for _, f in await client.xrange("once:bad")] == ["evt_8"]
    await client.aclose()


@needs_redis
async def test_a_redis_at_maxmemory_with_noeviction_refuses_appends_and_records_delivered_only_what_it_stored(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """The append script's first write was EXPIRE, which Redis does not check against maxmemory,
    and a script without flags that has written is not checked again: XADDs went on past the
    limit (3 MB set, 27 MB used; outside probe). docs/sinks.md: out of memory is `rejected`."""
    client = redis_client(redis_server.port)
    await client.config_set("maxmemory", "3mb")
    await client.config_set("maxmemory-policy", "noeviction")
    await ferry.subscribe("oom", ["s"], f"{redis_server.url}/0?stream=oom", batch_size=10, max_attempts=2,
                          retry_base_ms=20, retry_max_ms=50)  # fmt: skip
    pad = "x" * 20_000
    await ferry.publish_many([{"stream": "s", "payload": {"n": n, "pad": pad}} for n in range(300)])  # ~6 MB

    async def settled() -> bool:
        done = await conn.fetchval(
            "select count(distinct event_id) from ferry.attempt_history() where error_class is null"
        )
        return bool(done + await conn.fetchval("select count(*) from ferry.dead_letters") == 300)

    await eventually(settled, timeout=60, what="each event stored or dead")
    delivered = {
        r[0] for r in await conn.fetch("select event_id from ferry.attempt_history() where error_class is null")
    }
    stored = [int(f["webhook-id"].removeprefix("evt_")) for _, f in await client.xrange("oom")]
    assert sorted(stored) == sorted(delivered)  # nothing recorded delivered that Redis does not hold, once each
    assert len(stored) * 20_000 < 3_500_000, len(stored)  # the limit, and at most a chunk's worth past it
    assert int((await client.info("memory"))["used_memory"]) < 4 * 2**20
    failures = await conn.fetch("select error_class, error from ferry.attempt_history() where error_class is not null")
    assert failures and all(r[0] == "rejected" and "out of memory (maxmemory)" in r[1] for r in failures), failures[:3]
    await client.aclose()


@needs_redis
async def test_more_appends_at_once_than_connections_wait_for_one_and_fail_none(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """200 in flight against a pool of 64: "Too many connections" was recorded as the server
    failing, marked it down and up, and reconnecting left connections open by the thousand."""
    await ferry.subscribe("wide", ["s"], f"{redis_server.url}/4?stream=wide:{{key}}", max_in_flight=200)
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}, "key": str(n % 20)} for n in range(2000)])
    await eventually(recorded(conn, "wide", 2000), timeout=60, what="2,000 attempts recorded")
    failed = await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is not null")
    client = redis_client(redis_server.port, db=4)
    clients = int((await client.info("clients"))["connected_clients"])
    assert sum([await client.xlen(f"wide:{k}") for k in range(20)]) == 2000
    await client.aclose()
    assert failed == 0 and clients <= 64 + 1  # the pool, and this client


@needs_redis
async def test_a_database_the_server_lacks_fails_its_subscription_only(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """It was a "connect" failure: after five the server was held as down for every subscription."""
    await ferry.subscribe("nodb", ["bad"], f"{redis_server.url}/20?stream=x", max_attempts=50)
    await ferry.subscribe("fine", ["good"], f"{redis_server.url}/5?stream=y")
    await ferry.publish_many([{"stream": "bad", "payload": {"n": n}} for n in range(10)])

    async def failing() -> bool:
        return bool(
            await conn.fetchval("select count(*) from ferry.attempt_history() where subscription = 'nodb'") >= 10
        )

    await eventually(failing, what="the bad database's attempts")
    await ferry.publish_many([{"stream": "good", "payload": {"n": n}} for n in range(5)])
    await eventually(recorded(conn, "fine", 5), timeout=5, what="the other subscription's 5 (never held)")
    classes = await conn.fetch(
        "select distinct error_class, error from ferry.attempt_history() where subscription = 'nodb'"
    )
    assert [r["error_class"] for r in classes] == ["config"] and "DB index is out of range" in classes[0]["error"]


@dataclasses.dataclass
class BrokerSide:
    """One broker's side of a test: the subscription URL and what the broker holds."""

    url: str
    #: messages stored so far (cheap)
    count: Callable[[], Awaitable[int]]
    #: every message stored: (webhook-id, payload), in the broker's order per key
    read: Callable[[], Awaitable[list[tuple[str, Any]]]]
    close: Callable[[], Awaitable[None]]


async def kill_test_broker(request: pytest.FixtureRequest, broker: str, keys: int) -> BrokerSide:
    """JetStream stream EO on eo.> or Redis streams eo:key<k>, starting only that broker's server."""
    if broker == "nats":
        server: NatsServer = request.getfixturevalue("nats_server")  # (an async fixture cannot be asked for here)
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="EO", subjects=["eo.>"])

        async def nats_count() -> int:
            return int((await js.stream_info("EO")).state.messages)

        async def nats_read() -> list[tuple[str, Any]]:
            return [(m.headers["webhook-id"], orjson.loads(m.data)) for m in await stream_messages(js, "EO")]

        return BrokerSide(f"{server.url}/eo.{{key}}", nats_count, nats_read, nc.close)
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    client = redis_client(redis_server.port)

    async def redis_count() -> int:
        return sum([await client.xlen(f"eo:key{k}") for k in range(keys)])

    async def redis_read() -> list[tuple[str, Any]]:
        entries = [f for k in range(keys) for _, f in await client.xrange(f"eo:key{k}")]
        return [(f["webhook-id"], orjson.loads(f["payload"])) for f in entries]

    return BrokerSide(f"{redis_server.url}/0?stream=eo:{{key}}", redis_count, redis_read, client.aclose)


@pytest.mark.parametrize("broker", ["nats", pytest.param("redis", marks=needs_redis)])
async def test_a_relay_killed_three_times_leaves_exactly_one_message_per_event_in_key_order(
    pgferry_cmd: list[str],
    db_url: str,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    request: pytest.FixtureRequest,
    broker: str,
) -> None:
    """Each broker alone (its half ran only where redis-server was installed). Every row has its
    own place (round, i) in its key's order: with one number per round, rows of a key reordered
    inside a round went unseen."""
    keys, rows = 8, 20
    target = await kill_test_broker(request, broker, keys)
    await ferry.subscribe("eo", ["s"], target.url, batch_size=50, ordered=True)
    relay = RelayProcess(pgferry_cmd, db_url)
    killed = asyncio.Event()

    async def write() -> int:  # one writer: each key's (round, i) grows in commit order; until the kills are done
        r = 0
        while not killed.is_set():
            await conn.execute(
                "select ferry.publish('s', jsonb_build_object('k', k, 'r', $1::int, 'i', i), 'key' || k) "
                "from generate_series(0, $2 - 1) k, generate_series(1, $3) i", r, keys, rows)  # fmt: skip
            r += 1
            await asyncio.sleep(0.1)
        return r

    writer = asyncio.create_task(write())
    try:
        for _ in range(3):  # kill -9 mid-run, once this relay is delivering
            before = await target.count()

            async def delivering(before: int = before) -> bool:
                return await target.count() > before

            await eventually(delivering, timeout=30, what="the relay to deliver")
            await asyncio.sleep(0.3)
            relay.stop()
            relay = RelayProcess(pgferry_cmd, db_url)
        killed.set()
        rounds = await writer
        total = keys * rounds * rows

        async def all_there() -> bool:
            return await target.count() >= total

        await eventually(all_there, timeout=60, what=f"{total} messages")
        await asyncio.sleep(1.0)  # anything still on its way would be a duplicate
        items = await target.read()
        ids = [i for i, _ in items]
        assert len(ids) == total and len(set(ids)) == total, f"{len(ids) - len(set(ids))} duplicate(s)"
        expected = [(r, i) for r in range(rounds) for i in range(1, rows + 1)]
        for k in range(keys):
            assert [(p["r"], p["i"]) for _, p in items if p["k"] == k] == expected, f"key {k} out of order"
    finally:
        writer.cancel()
        relay.stop()
        await target.close()


async def _attempt_errors(conn: asyncpg.Connection, subscription: str) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "select error_class, error from ferry.attempts where subscription = $1 and error_class is not null order by id",
        subscription,
    )
    return [(r["error_class"], r["error"]) for r in rows]


def _failed_with(conn: asyncpg.Connection, subscription: str, error_class: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return any(c == error_class for c, _ in await _attempt_errors(conn, subscription))

    return check


async def test_a_subject_no_stream_captures_is_retried_with_its_name_until_a_stream_does(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    await conn.execute(f"select ferry.subscribe('lost', array['s'], '{nats_server.url}/nowhere.{{key}}', "
                       f"timeout_ms => 2000, {FAST_RETRY})")  # fmt: skip
    event = await ferry.publish("s", {"n": 1}, key="a")
    await eventually(_failed_with(conn, "lost", "no_stream"), what="a no_stream attempt")
    error = next(e for c, e in await _attempt_errors(conn, "lost") if c == "no_stream")
    assert "'nowhere.a'" in error and "create one" in error
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    # The operator surface is the webhooks': status counts it as parked, trace shows why.
    status = next(r for r in await ferry.status() if r["name"] == "lost")
    assert status["parked"] == 1 and status["url"].startswith("nats://")
    traced = await inspect.trace(conn, event)
    assert any(a["error_class"] == "no_stream" for a in traced.attempts)
    await js.add_stream(name="LATE", subjects=["nowhere.>"])

    async def delivered() -> bool:
        return bool((await js.stream_info("LATE")).state.messages == 1)

    await eventually(delivered, what="the event once a stream captures its subject")
    assert (await js.get_msg("LATE", 1)).headers["webhook-id"] == f"evt_{event}"
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0


async def test_a_no_stream_attempt_of_a_batch_names_no_subject_that_is_not_its_events(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer
) -> None:
    """Each event of a batch was recorded with the batch's first failing subject: keys k2 and k0
    both showed 'nomatch.k1' (outside probe)."""
    await conn.execute(f"select ferry.subscribe('lost', array['s'], '{nats_server.url}/nomatch.{{key}}', "
                       f"batch_size => 10, timeout_ms => 2000, {FAST_RETRY})")  # fmt: skip
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}, "key": f"k{n}"} for n in range(3)])
    await eventually(_failed_with(conn, "lost", "no_stream"), what="a no_stream attempt")
    rows = await conn.fetch(
        "select a.error, e.key from ferry.attempt_history() a join ferry.events e on e.id = a.event_id "
        "where a.error_class = 'no_stream'"
    )
    for error, key in rows:
        named = set(re.findall(r"'(nomatch\.[^']*)'", error))
        assert f"nomatch.{key}" in named, (key, error)  # its own subject, and those of its batch's others
        assert named <= {"nomatch.k0", "nomatch.k1", "nomatch.k2"}, (key, error)
    assert {key for _, key in rows} == {"k0", "k1", "k2"}


async def test_a_subject_outside_a_streams_subjects_is_parked_and_retried_until_the_stream_takes_it(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """A stream exists, on other subjects: the error names the subject, the event is parked and
    retried (not dead at once), counted by error class in the metrics, and delivered once the
    operator adds the subject to the stream."""
    await js.add_stream(name="OTHER", subjects=["other.>"])
    await conn.execute(f"select ferry.subscribe('astray', array['s'], '{nats_server.url}/nowhere.{{key}}', "
                       f"timeout_ms => 2000, {FAST_RETRY})")  # fmt: skip
    relay = RunningRelay(db_url, dataclasses.replace(FAST, metrics_port=0))
    try:
        event = await ferry.publish("s", {"n": 1}, key="a")

        async def retried() -> bool:
            return sum(c == "no_stream" for c, _ in await _attempt_errors(conn, "astray")) >= 2

        await eventually(retried, what="two no_stream attempts")
        errors = await _attempt_errors(conn, "astray")
        assert {c for c, _ in errors} == {"no_stream"}
        assert all("subject 'nowhere.a'" in e and "stream's subjects" in e for _, e in errors), errors
        assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
        assert next(r for r in await ferry.status() if r["name"] == "astray")["parked"] == 1
        failures = value(await scrape(relay.relay.addresses["metrics"]), "pgferry_delivery_failures_total",
                         subscription="astray", error_class="no_stream")  # fmt: skip
        assert failures >= 2
        await js.update_stream(name="OTHER", subjects=["other.>", "nowhere.>"])

        async def delivered() -> bool:
            return bool((await js.stream_info("OTHER")).state.messages == 1)

        await eventually(delivered, what="the event once the stream takes its subject")
        assert (await js.get_msg("OTHER", 1)).headers["webhook-id"] == f"evt_{event}"
        assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0

        async def counted() -> bool:
            samples = await scrape(relay.relay.addresses["metrics"])
            return value(samples, "pgferry_deliveries_total", subscription="astray") == 1

        await eventually(counted, what="the delivery in the metrics")
    finally:
        await relay.stop()


async def test_a_message_over_the_servers_max_payload_is_dead_lettered_with_the_reason(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    async with nats_with("max_payload: 2048") as (server, js):
        await js.add_stream(name="SMALL", subjects=["small"])
        await js.add_stream(name="TINY", subjects=["tiny"], max_msg_size=500)
        await ferry.subscribe("small", ["s"], f"{server.url}/small")
        await ferry.subscribe("tiny", ["t"], f"{server.url}/tiny")
        big = await ferry.publish("s", {"blob": "x" * 4000})
        fine = await ferry.publish("s", {"n": 1})
        over_stream = await ferry.publish("t", {"blob": "x" * 1000})  # under max_payload, over max_msg_size

        async def buried() -> bool:
            return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 2)

        await eventually(buried, what="the big events in dead letters")
        letters = {r["event_id"]: r["last_error"] for r in await conn.fetch("select * from ferry.dead_letters")}
        assert "max_payload" in letters[big] and "2048" in letters[big]
        assert "max_msg_size" in letters[over_stream]

        async def stored() -> bool:
            return bool((await js.stream_info("SMALL")).state.messages == 1)

        await eventually(stored, what="the small event")
        assert (await js.get_msg("SMALL", 1)).headers["webhook-id"] == f"evt_{fine}"


async def test_messages_at_the_max_payload_boundary_and_overlong_subjects_are_refused_not_timed_out(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """The size check left out the header block's 12 framing bytes, and a 5,000-byte key made a
    subject over the server's control line: the server closed the connection each time, recorded
    as timeouts of that event and of the others in flight on it."""
    async with nats_with("max_payload: 1024") as (server, js):
        await js.add_stream(name="EDGE", subjects=["edge.>"])
        await ferry.subscribe("edge", ["s"], f"{server.url}/edge.{{key}}", timeout_ms=2000, max_attempts=2)
        ids = [await ferry.publish("s", {"p": "x" * n}, key="k") for n in range(820, 940, 2)]
        ids.append(await ferry.publish("s", {"p": 1}, key="k" * 5000))
        # Under the limit counted in characters, over it in bytes (headers are UTF-8).
        ids.append(await ferry.publish("s", {"p": 1}, key="k", headers={"x-note": "é" * 500}))

        async def settled() -> bool:
            dead = await conn.fetchval("select count(*) from ferry.dead_letters")
            return bool(dead + (await js.stream_info("EDGE")).state.messages == len(ids))

        await eventually(settled, timeout=30, what="each event stored or dead")
        classes = {r[0] for r in await conn.fetch("select distinct error_class from ferry.attempt_history()")}
        assert classes <= {None, "too_large"}, classes
        reasons = [r[0] for r in await conn.fetch("select last_error from ferry.dead_letters order by event_id")]
        assert reasons[-2].startswith(f"the subject of evt_{ids[-2]} is 5005 bytes") and len(reasons) > 2
        assert "over" in reasons[-1] and "1024" in reasons[-1], reasons[-1]


async def test_a_subject_nothing_acknowledges_holds_its_subscription_alone(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """A plain subscriber on a subject no stream captures takes the publish and answers nothing:
    timeouts, which marked the whole server down and held every subscription on it, the healthy
    one too, and each probe closed the connection they share (outside probe)."""
    await js.add_stream(name="GOOD", subjects=["good.>"])
    listener = await nats.connect(nats_server.url)

    async def ignore(_msg: Any) -> None:  # takes it, never answers
        return None

    await listener.subscribe("dbg.>", cb=ignore)
    try:
        await ferry.subscribe("bad", ["s"], f"{nats_server.url}/dbg.x", timeout_ms=300)
        await ferry.subscribe("good", ["s"], f"{nats_server.url}/good.x")
        for n in range(10):
            await ferry.publish("s", {"n": n})
        await eventually(_failed_with(conn, "bad", "timeout"), what="bad's timeouts")
        await asyncio.sleep(3)  # bad is held by now (5 timeouts of 0.3 s)
        started = time.monotonic()
        for n in range(10, 15):
            await ferry.publish("s", {"n": n})

        async def good_has_all() -> bool:
            return bool((await js.stream_info("GOOD")).state.messages == 15)

        await eventually(good_has_all, timeout=10, what="good's 15 messages")
        assert time.monotonic() - started < 3
        status = {r["name"]: r["health"] for r in await inspect.subscription_status(conn)}
        assert status["bad"].startswith("down for") and not status["good"].startswith("down"), status
    finally:
        await listener.close()


async def test_a_stream_with_no_ack_dead_letters_its_events_once_naming_it_and_holds_nothing(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """A stream created with no_ack stores each message and never acknowledges it: taken for a
    frozen server, its subscription was held and probed for good, and each probe after the
    duplicate window stored the event again (7 copies in 50 s: outside probe). Its events are
    dead-lettered naming the stream and sent no more; the events of their chunk that an
    acknowledging stream captures are delivered, and nothing is held."""
    await js.add_stream(StreamConfig(name="QUIET", subjects=["na.quiet"], no_ack=True))
    await js.add_stream(name="LOUD", subjects=["na.loud", "beside"])
    await ferry.subscribe("na", ["s"], f"{nats_server.url}/na.{{key}}", batch_size=6, timeout_ms=300)
    await ferry.subscribe("beside", ["s"], f"{nats_server.url}/beside")
    async with conn.transaction():  # one chunk: quiet, loud, quiet, ...
        ids = [await conn.fetchval("select ferry.publish('s', jsonb_build_object('n', $1::int), key => $2)",
                                   n, "quiet" if n % 2 == 0 else "loud") for n in range(6)]  # fmt: skip
    quiet, loud = ids[0::2], ids[1::2]

    async def buried() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == len(quiet))

    await eventually(buried, timeout=20, what="the quiet stream's events in dead letters")
    letters = {r["event_id"]: r["last_error"] for r in await conn.fetch("select * from ferry.dead_letters")}
    assert sorted(letters) == sorted(quiet)
    assert all("stream 'QUIET'" in e and "has no_ack" in e and "recreate it without no_ack" in e
               for e in letters.values()), letters  # fmt: skip
    attempts = await conn.fetchval("select count(*) from ferry.attempt_history() where subscription = 'na'")
    await asyncio.sleep(2.5)  # no probe, no retry: nothing published again
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where subscription = 'na'") == attempts
    classes = {r[0] for r in await conn.fetch("select distinct error_class from ferry.attempt_history()")}
    assert classes <= {None, "rejected", "no_ack"}, classes
    assert sorted(m.headers["webhook-id"] for m in await stream_messages(js, "QUIET")) == sorted(
        f"evt_{i}" for i in quiet
    )
    stored = [m.headers["webhook-id"] for m in await stream_messages(js, "LOUD") if m.subject == "na.loud"]
    assert stored == [f"evt_{i}" for i in loud]
    await ferry.publish("s", {"n": 6})

    async def beside_has_all() -> bool:
        return bool(sum(m.subject == "beside" for m in await stream_messages(js, "LOUD")) == 7)

    await eventually(beside_has_all, timeout=10, what="the other subscription's 7 messages")
    status = {r["name"]: r["health"] for r in await inspect.subscription_status(conn)}
    assert not status["na"].startswith("down") and not status["beside"].startswith("down"), status


async def test_an_ordered_chunk_whose_first_event_is_refused_keeps_its_key_in_order(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer, js: Any
) -> None:
    """A stream full for now refuses a key's first event of a chunk and stores the next two: once
    the first was retried the stream held them 2, 3, 1 (outside probe). An ordered subscription's
    chunk goes a key's event after another, each key stopping at its first failure."""
    await js.add_stream(StreamConfig(name="FULL", subjects=["full.>"], max_bytes=4000, discard=DiscardPolicy.NEW))
    await js.publish("full.filler", b"x" * 2000)
    await ferry.subscribe("ord", ["s"], f"{nats_server.url}/full.{{key}}", ordered=True, batch_size=10,
                          retry_base_ms=100, retry_max_ms=300)  # fmt: skip
    async with conn.transaction():
        for n, size in ((1, 2500), (2, 10), (3, 10)):
            await conn.execute("select ferry.publish('s', jsonb_build_object('n', $1::int, 'p', repeat('x', $2::int)), "
                               "key => 'a')", n, size)  # fmt: skip
    await eventually(_failed_with(conn, "ord", "rejected"), what="the first refused")
    await js.purge_stream("FULL", subject="full.filler")  # room again

    async def stored() -> bool:
        return bool((await js.stream_info("FULL")).state.messages == 3)

    await eventually(stored, timeout=15, what="the three stored")
    assert [orjson.loads(m.data)["n"] for m in await stream_messages(js, "FULL")] == [1, 2, 3]


async def _subscribe_both(conn: asyncpg.Connection, nats_url: str, redis_url: str, options: str) -> None:
    """Subscriptions n (JetStream) and r (Redis Streams) to stream s, retrying fast, with ``options``."""
    for name, target in (("n", nats_url), ("r", redis_url)):
        await conn.execute(f"select ferry.subscribe('{name}', array['s'], '{target}', {options}, {FAST_RETRY})")


@needs_redis
async def test_brokers_down_and_back_get_everything_once_and_a_webhook_beside_them_is_not_held_up(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    nats_server: NatsServer,
    js: Any,
    redis_server: RedisServer,
    receiver_factory: Any,
) -> None:
    await js.add_stream(name="DOWN", subjects=["down"])
    receiver, url = await receiver_factory()
    await _subscribe_both(conn, f"{nats_server.url}/down", f"{redis_server.url}/0?stream=down", "timeout_ms => 1500")
    await ferry.subscribe("hook", ["s"], url)
    first = await ferry.publish("s", {"n": 0})
    client = redis_client(redis_server.port)

    async def counts() -> tuple[int, int]:
        return (await js.stream_info("DOWN")).state.messages, await client.xlen("down")

    async def have(n: int) -> bool:
        return await counts() == (n, n)

    await eventually(lambda: have(1), what="the first event in both brokers")
    nats_server.stop()
    redis_server.stop()
    ids = [await ferry.publish("s", {"n": n}) for n in range(1, 21)]

    async def hook_got_all() -> bool:
        return {first, *ids} <= {int(r.headers["webhook-id"][4:]) for r in receiver.received}

    await eventually(hook_got_all, what="the webhook's events while both brokers are down")
    await eventually(_failed_with(conn, "r", "connect"), what="Redis failures recorded")
    await eventually(_failed_with(conn, "n", "connect"), what="NATS failures recorded")
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    nats_server.start()
    redis_server.start()
    await eventually(lambda: have(21), timeout=30, what="all 21 events in both brokers")
    await asyncio.sleep(1.0)
    assert await counts() == (21, 21)
    await client.aclose()


@needs_redis
async def test_brokers_frozen_past_the_timeout_record_timeouts_and_end_with_each_event_once(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    nats_server: NatsServer,
    js: Any,
    redis_server: RedisServer,
) -> None:
    """A slow broker: frozen (SIGSTOP) while messages are on the way, so that some reach it and
    are never answered in time. The attempts time out and are retried once it thaws; the retry
    must not store them twice (JetStream drops a repeated Nats-Msg-Id, the Redis script a
    repeated event id), and the order per key still holds."""
    await js.add_stream(name="SLOW", subjects=["slow.>"])
    await _subscribe_both(conn, f"{nats_server.url}/slow.{{key}}", f"{redis_server.url}/0?stream=slow:{{key}}",
                          "timeout_ms => 500, ordered => true")  # fmt: skip
    client = redis_client(redis_server.port)
    keys = ["a", "b"]

    async def counts() -> tuple[int, int]:
        stored = sum([await client.xlen(f"slow:{k}") for k in keys])
        return (await js.stream_info("SLOW")).state.messages, stored

    await ferry.publish("s", {"n": 0}, key="a")
    await eventually(lambda: _equals(counts(), (1, 1)), what="the first event in both brokers")
    assert nats_server.proc is not None and redis_server.proc is not None
    for proc in (nats_server.proc, redis_server.proc):
        proc.send_signal(signal.SIGSTOP)
    try:
        for n in range(1, 41):
            await ferry.publish("s", {"n": n}, key=keys[n % 2])
        await eventually(_failed_with(conn, "n", "timeout"), what="NATS timeouts recorded")
        await eventually(_failed_with(conn, "r", "timeout"), what="Redis timeouts recorded")
    finally:
        for proc in (nats_server.proc, redis_server.proc):
            proc.send_signal(signal.SIGCONT)
    await eventually(lambda: _equals(counts(), (41, 41)), timeout=30, what="all 41 events in both brokers")
    await asyncio.sleep(1.5)  # a duplicate would land after the count was first reached
    assert await counts() == (41, 41)
    expected = {k: [n for n in range(41) if (n == 0 and k == "a") or (n > 0 and keys[n % 2] == k)] for k in keys}
    for k in keys:
        assert [orjson.loads(f["payload"])["n"] for _, f in await client.xrange(f"slow:{k}")] == expected[k]
    by_subject: dict[str, list[int]] = {}
    for m in await stream_messages(js, "SLOW"):
        by_subject.setdefault(m.subject, []).append(orjson.loads(m.data)["n"])
    assert by_subject == {f"slow.{k}": expected[k] for k in keys}
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    await client.aclose()


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


@needs_redis
async def test_wrong_or_missing_credentials_are_recorded_as_auth_until_they_are_set_and_never_logged(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the relay's log, every logger, debug included
    nats_server = NatsServer('authorization { user: "pf", password: "s3cret-N4TS" }')
    redis_server = RedisServer()
    nats_server.start()
    redis_server.start()
    try:
        client = await nats.connect(nats_server.url, user="pf", password="s3cret-N4TS")
        js = client.jetstream()
        await js.add_stream(name="AUTH", subjects=["auth"])
        rclient = redis_client(redis_server.port)
        await rclient.config_set("requirepass", "r3dis-S3CRET")
        for name, target in (("n", f"{nats_server.url}/auth"), ("r", f"{redis_server.url}/0?stream=auth")):
            await conn.execute(f"select ferry.subscribe('{name}', array['s'], '{target}', {FAST_RETRY})")
        await ferry.publish("s", {"n": 1})
        await eventually(_failed_with(conn, "n", "auth"), what="a NATS auth failure")
        await eventually(_failed_with(conn, "r", "auth"), what="a Redis auth failure")
        # Wrong ones: a token the server does not take, and a wrong password, which is auth, not
        # config (WRONGPASS has no "AUTH" in it: outside probe).
        await conn.execute("""select ferry.set_subscription_credentials('n', '{"token": "t0ken-S3CRET"}')""")
        await conn.execute("""select ferry.set_subscription_credentials('r', '{"password": "wr0ng-S3CRET"}')""")
        await conn.execute("delete from ferry.attempts; delete from ferry.deliveries")

        async def wrong_ones_seen() -> bool:
            return bool(
                await conn.fetchval(
                    "select count(distinct subscription) from ferry.attempt_history() where error_class = 'auth'"
                )
                == 2
                and await conn.fetch(
                    "select 1 from ferry.attempt_history() where subscription = 'r' and error like '%WRONGPASS%'"
                )
            )

        await eventually(wrong_ones_seen, timeout=20, what="failures with the wrong token and password")
        assert {r[0] for r in await conn.fetch("select error_class from ferry.attempt_history()")} == {"auth"}
        assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
        await conn.execute(
            """select ferry.set_subscription_credentials('n', '{"user": "pf", "password": "s3cret-N4TS"}')"""
        )
        await conn.execute("""select ferry.set_subscription_credentials('r', '{"password": "r3dis-S3CRET"}')""")
        await rclient.aclose()
        rclient = redis_client(redis_server.port, password="r3dis-S3CRET")

        async def delivered() -> bool:
            return bool((await js.stream_info("AUTH")).state.messages == 1 and await rclient.xlen("auth") == 1)

        await eventually(delivered, timeout=20, what="delivery once the credentials are set")
        errors = " ".join(e for _, e in await _attempt_errors(conn, "n") + await _attempt_errors(conn, "r"))
        assert any(r.name.startswith("pgferry") for r in caplog.records)  # the relay's log was seen
        for secret in ("s3cret-N4TS", "r3dis-S3CRET", "t0ken-S3CRET", "wr0ng-S3CRET"):
            assert secret not in errors and secret not in caplog.text, secret
        await client.close()
        await rclient.aclose()
    finally:
        nats_server.close()
        redis_server.close()


async def _replay(pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, *output: str) -> None:
    """``pgferry replay rp --since 10m``: 3 events queued, and the replay recorded."""
    done = await cli(pgferry_cmd, db_url, "replay", "rp", "--since", "10m", *output)
    assert done.returncode == 0, done.stderr
    if output:
        assert orjson.loads(done.stdout)["queued"] == 3
    else:  # the operator is told the broker may drop them (they are recorded as delivered)
        assert "3 event(s) queued" in done.stdout and "within its duplicate window" in done.stdout, done.stdout
    await eventually(_no_retries(conn), what="the replay to be recorded")


@needs_redis
async def test_a_replay_inside_the_dedup_window_adds_nothing_and_after_it_appends_again(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    redis_server: RedisServer,
    pgferry_cmd: list[str],
    db_url: str,
) -> None:
    await ferry.subscribe("rp", ["s"], f"{redis_server.url}/0?stream=rp&dedup_window=2")
    for n in range(3):
        await ferry.publish("s", {"n": n})
    client = redis_client(redis_server.port)

    async def length(n: int) -> bool:
        return bool(await client.xlen("rp") == n)

    await eventually(lambda: length(3), what="3 entries")
    await _replay(pgferry_cmd, db_url, conn)  # within the window: the same webhook-ids, dropped as duplicates
    assert await client.xlen("rp") == 3
    await asyncio.sleep(4.1)  # two windows: the marks are gone
    await _replay(pgferry_cmd, db_url, conn, "--json")
    await eventually(lambda: length(6), what="the replayed entries")
    await client.aclose()


@needs_redis
async def test_a_subscription_moved_to_another_redis_stream_and_replayed_inside_the_window_stores_there(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    redis_server: RedisServer,
    pgferry_cmd: list[str],
    db_url: str,
) -> None:
    """The marks were the subscription's, whatever the stream: moved from `mv:a` to `mv:b` and
    replayed inside the window, every event was recorded delivered and `mv:b` got none (outside
    probe). A mark now holds back only the same event to the same stream key."""
    await ferry.subscribe("rp", ["s"], f"{redis_server.url}/0?stream=mv:a", batch_size=2)
    for n in range(3):
        await ferry.publish("s", {"n": n})
    client = redis_client(redis_server.port)
    await eventually(lambda: _equals(client.xlen("mv:a"), 3), what="3 entries in mv:a")
    moved = await cli(pgferry_cmd, db_url, "subscription", "add", "rp", "--stream", "s", "--url",
                      f"{redis_server.url}/0?stream=mv:b", "--batch-size", "2")  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    await _replay(pgferry_cmd, db_url, conn)  # inside the window (120 s)
    await eventually(lambda: _equals(client.xlen("mv:b"), 3), what="3 entries in mv:b")
    assert [f["webhook-id"] for _, f in await client.xrange("mv:b")] == [
        f["webhook-id"] for _, f in await client.xrange("mv:a")
    ]
    await _replay(pgferry_cmd, db_url, conn)  # the same stream again: dropped as duplicates
    assert await client.xlen("mv:b") == 3 and await client.xlen("mv:a") == 3
    await client.aclose()


async def test_a_jetstream_replay_inside_the_duplicate_window_adds_nothing_and_after_it_publishes_again(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    nats_server: NatsServer,
    js: Any,
    pgferry_cmd: list[str],
    db_url: str,
) -> None:
    window = 4.0
    await js.add_stream(name="RP", subjects=["rp"], duplicate_window=window)
    await ferry.subscribe("rp", ["s"], f"{nats_server.url}/rp")
    ids = [await ferry.publish("s", {"n": n}) for n in range(3)]

    async def count(n: int) -> bool:
        return bool((await js.stream_info("RP")).state.messages == n)

    await eventually(lambda: count(3), what="3 messages")
    stored = time.monotonic()
    await _replay(pgferry_cmd, db_url, conn)  # within the window: the same Nats-Msg-Id, dropped as duplicates
    assert time.monotonic() - stored < window, "the replay came after the window: nothing to test (a loaded machine?)"
    assert await count(3)
    await asyncio.sleep(stored + window + 0.5 - time.monotonic())  # the stream forgot the ids
    await _replay(pgferry_cmd, db_url, conn, "--json")
    await eventually(lambda: count(6), what="the replayed messages")
    webhook_ids = [m.headers["webhook-id"] for m in await stream_messages(js, "RP")]
    assert webhook_ids == [f"evt_{i}" for i in ids] * 2


def _no_retries(conn: asyncpg.Connection):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.retries") == 0)

    return check


@needs_redis
async def test_brokers_are_held_to_the_relays_address_policy(
    nats_server: NatsServer, redis_server: RedisServer
) -> None:
    strict = Brokers(AddressPolicy(strict=True))
    for connect in (
        strict.jetstream("127.0.0.1", nats_server.port, {}),
        strict.redis("127.0.0.1", redis_server.port, 0, {}),
        Brokers().redis("169.254.169.254", 6379, 0, {}),  # cloud metadata: refused in any mode
    ):
        with pytest.raises(BrokerUnreachable) as refused:
            await connect
        assert refused.value.error_class == "refused_address"
        assert "to prevent SSRF" in str(refused.value), refused.value
    allowed = Brokers(AddressPolicy(strict=True, allow=parse_networks("127.0.0.1/32")))
    try:
        await allowed.jetstream("127.0.0.1", nats_server.port, {})
        assert await (await allowed.redis("127.0.0.1", redis_server.port, 0, {})).call("PING") == b"PONG"
    finally:
        await allowed.close()


@needs_redis
async def test_a_stream_key_of_another_type_fails_only_its_own_events_and_is_named_and_dlq_replay_delivers_them(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    redis_server: RedisServer,
    pgferry_cmd: list[str],
    db_url: str,
) -> None:
    """One stream key holding a string failed the whole chunk, events on other keys too, and the
    error named the chunk's first stream (outside probe)."""
    client = redis_client(redis_server.port)
    await client.set("x:k2", "not a stream")
    await ferry.subscribe("mixed", ["s"], f"{redis_server.url}/0?stream=x:{{key}}", batch_size=5, max_attempts=2,
                          retry_base_ms=50, retry_max_ms=100)  # fmt: skip
    ids = [await ferry.publish("s", {"n": n}, key=f"k{n % 5}") for n in range(10)]

    async def settled() -> bool:
        dead = await conn.fetchval("select count(*) from ferry.dead_letters")
        stored = sum([await client.xlen(f"x:k{k}") for k in (0, 1, 3, 4)])
        return bool(dead == 2 and stored == 8)

    await eventually(settled, timeout=30, what="the other keys' events stored, k2's dead")
    dead = await conn.fetch("select event_id, last_error from ferry.dead_letters order by event_id")
    assert [r["event_id"] for r in dead] == [ids[2], ids[7]]
    assert all("'x:k2'" in r["last_error"] and "WRONGTYPE" in r["last_error"] for r in dead), dead
    # Fixed, and retried from the dead letters by the operator: delivered, in order, once.
    await client.delete("x:k2")
    done = await cli(pgferry_cmd, db_url, "dlq", "replay", "mixed")
    assert done.returncode == 0 and "2 dead letter(s) queued" in done.stdout, (done.stdout, done.stderr)

    async def redelivered() -> bool:
        return bool(await client.xlen("x:k2") == 2 and not await conn.fetchval("select count(*) from ferry.retries"))

    await eventually(redelivered, timeout=20, what="the dead letters delivered")
    assert [f["webhook-id"] for _, f in await client.xrange("x:k2")] == [f"evt_{ids[2]}", f"evt_{ids[7]}"]
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    await client.aclose()


async def test_a_nats_credentials_file_the_relay_cannot_read_is_a_config_error_naming_it(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer
) -> None:
    """It was an internal error with a traceback (nkeys, which nats-py needs for it, was not
    installed), and with nkeys a missing file would have read as the server being unreachable."""
    await ferry.subscribe("creds", ["s"], f"{nats_server.url}/c.{{key}}", max_attempts=50)
    await conn.execute(
        """select ferry.set_subscription_credentials('creds', '{"creds_file": "/nonexistent/u.creds"}')"""
    )
    await ferry.publish("s", {"n": 1}, key="k")

    async def refused() -> bool:  # (the relay may try once before it sees the credentials)
        return bool(await conn.fetchval(
            "select count(*) from ferry.attempt_history() where subscription = 'creds' and error_class = 'config'"
            " and error like '%cannot read the NATS credentials file ''/nonexistent/u.creds''%'"))  # fmt: skip

    await eventually(refused, what="an attempt refused as config, naming the file")
    classes = {
        r[0] for r in await conn.fetch("select error_class from ferry.attempt_history() where subscription = 'creds'")
    }
    assert "internal" not in classes and "connect" not in classes, classes
    assert importlib.util.find_spec("nkeys") is not None  # installed with nats-py[nkeys]: creds files need it


def _user_nkey() -> tuple[str, str]:
    """A new user nkey: (seed, public key)."""
    import nkeys  # type: ignore[import-untyped]

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


SEED_BLOCK = "-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n"
JWT_BLOCK = "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.e30.c2ln\n------END NATS USER JWT------\n\n"


async def test_a_nats_creds_file_without_both_blocks_is_a_config_error_naming_it_and_the_relay_goes_on(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, nats_server: NatsServer,
    js: Any, tmp_path: Path,
) -> None:  # fmt: skip
    """nats-py looks for the JWT block on the event loop and loops forever at the end of a file
    without one: one subscription with such a file froze the relay, its other subscriptions too,
    and every relay that took it over (outside probe). A malformed seed was an internal error
    (`ErrInvalidSeed()`)."""
    await js.add_stream(name="C", subjects=["c.>"])
    seed, _ = _user_nkey()
    files = {
        "nothing": ("just some text\n", "neither a NATS user JWT nor a user nkey seed"),
        "jwt-only": (JWT_BLOCK, "a JWT block but no user nkey seed"),
        "bad-seed": (JWT_BLOCK + SEED_BLOCK.format("SUNOTASEED"), "no valid user nkey seed"),
        "account-seed": (JWT_BLOCK + SEED_BLOCK.format("SA" + seed[2:]), "nkey seed, not a user's"),
    }
    for name, (text, _) in files.items():
        path = tmp_path / f"{name}.creds"
        path.write_text(text)
        await ferry.subscribe(name, ["s"], f"{nats_server.url}/c.{name}", max_attempts=50)
        await ferry.set_credentials(name, {"creds_file": str(path)})
    await ferry.subscribe("plain", ["s"], f"{nats_server.url}/c.plain")  # beside them, no credentials
    for n in range(3):
        await ferry.publish("s", {"n": n})
    relay = RelayProcess(pgferry_cmd, db_url)
    try:

        async def plain_stored() -> bool:
            return bool((await js.stream_info("C")).state.messages == 3)

        await eventually(plain_stored, timeout=20, what="the plain subscription's 3 messages")
        for name, (_, says) in files.items():
            await eventually(_failed_with(conn, name, "config"), what=f"{name}: a config error")
            errors = {e for _, e in await _attempt_errors(conn, name)}
            assert all(f"{tmp_path / name}.creds" in e and says in e for e in errors), errors
        await ferry.publish("s", {"n": 3})
        await eventually(lambda: _equals(_stored(js, "C"), 4), timeout=10, what="a later event too")
    finally:
        relay.stop()
    classes = {r[0] for r in await conn.fetch("select distinct error_class from ferry.attempt_history()")}
    assert classes <= {None, "config"}, classes


async def _stored(js: Any, stream: str) -> int:
    return int((await js.stream_info(stream)).state.messages)


async def test_a_nats_user_nkey_seed_file_alone_logs_in_with_the_nkey(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, tmp_path: Path
) -> None:
    """A seed without a JWT (nk -gen user, or a .creds file's seed block): nkey authentication, the
    server knowing the user's public key; another user's seed is refused as auth."""
    seed, public = _user_nkey()
    other, _ = _user_nkey()
    server = NatsServer(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}')
    server.start()
    try:
        client = await nats.connect(server.url, nkeys_seed_str=seed)
        js = client.jetstream()
        try:
            await js.add_stream(name="NK", subjects=["nk.>"])
            for name, text in (("bare", f"{seed}\n"), ("block", SEED_BLOCK.format(seed)), ("other", other)):
                path = tmp_path / f"{name}.seed"
                path.write_text(text)
                await ferry.subscribe(name, ["s"], f"{server.url}/nk.{name}", max_attempts=50)
                await ferry.set_credentials(name, {"creds_file": str(path)})
            await ferry.publish("s", {"n": 1})
            await eventually(lambda: _equals(_stored(js, "NK"), 2), what="bare's and block's messages")
            await eventually(_failed_with(conn, "other", "auth"), what="other's seed refused as auth")
        finally:
            await client.close()
    finally:
        server.close()


@needs_redis
async def test_a_redis_frozen_before_the_first_connection_is_waited_for_not_an_internal_error(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, redis_server: RedisServer
) -> None:
    """Frozen before the relay connected: redis-py's own TimeoutError in the handshake was not
    caught, and the attempts were internal errors (no endpoint failure: never held as down) that
    ran into dead letters for events that were in fact appended (outside probe)."""
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        await ferry.subscribe("cold", ["s"], f"{redis_server.url}/0?stream=cold", timeout_ms=500, max_attempts=50)
        for n in range(5):
            await ferry.publish("s", {"n": n})
        await eventually(_failed_with(conn, "cold", "connect"), timeout=30, what="a connect failure recorded")
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    client = redis_client(redis_server.port)
    await eventually(lambda: _equals(client.xlen("cold"), 5), timeout=30, what="the five events stored")
    classes = {
        r[0]
        for r in await conn.fetch(
            "select distinct error_class from ferry.attempt_history() where error_class is not null"
        )
    }
    assert classes <= {"connect", "timeout"}, classes
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    await client.aclose()


class _NatsWithoutJetStream(NatsServer):
    def command(self) -> list[str]:
        conf = self.dir / "nats.conf"
        conf.write_text(f'listen: "127.0.0.1:{self.port}"\n')
        return [nats_server_binary(), "-c", str(conf)]


async def test_broker_tls_and_servers_without_jetstream_are_named_for_what_they_are(tmp_path: Path) -> None:
    """A NATS server requiring TLS with a private CA failed as `connect` (held as down) where a
    webhook's fails as `tls`; a server without JetStream said "create one (nats stream add ...)";
    an IPv6 host printed as ::1:4222 (outside probe)."""
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "server.pem")
    server = NatsServer(f'tls {{ cert_file: "{tmp_path / "server.pem"}", key_file: "{tmp_path / "server.pem"}" }}')
    plain = _NatsWithoutJetStream()
    brokers = Brokers()
    try:
        server.start()
        with pytest.raises(BrokerUnreachable) as refused:
            await brokers.jetstream("127.0.0.1", server.port, {})
        assert refused.value.error_class == "tls", refused.value
        assert f"TLS error with NATS at 127.0.0.1:{server.port}: certificate verify failed" in str(refused.value)
        plain.start()
        ctx = DeliveryContext(pool=None, http=None, global_limit=None)  # type: ignore[arg-type]
        sink = JetStreamSink(subscription(name="nojs", url=f"{plain.url}/orders"), ctx)
        events = [OutEvent(1, "s", "k", "{}", None, datetime.now(UTC))]
        try:
            result = await sink.send(events, sink.prepare(events), None, fresh=False)
        finally:
            await ctx.brokers.close()
        assert result.error_class == "no_stream" and "JetStream is not enabled on the NATS server" in (
            result.error or ""
        )
        with pytest.raises(BrokerUnreachable) as unreachable:
            await brokers.jetstream("::1", plain.port, {})  # nothing listens there on IPv6
        assert f"[::1]:{plain.port}" in str(unreachable.value), unreachable.value
    finally:
        await brokers.close()
        server.close()
        plain.close()
