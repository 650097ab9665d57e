"""The Redis Streams sink: each event is one entry appended with ``XADD``, exactly once.

A subscription's URL ``redis://host:6379/<db>?stream=<template>`` names the
stream key (``delivery.destinations``); ``maxlen=N`` trims it approximately
(``MAXLEN ~ N``). Each entry holds the fields ``webhook-id``, ``stream``,
``key`` (absent for an event without one), ``payload`` (the event's payload
exactly as stored), ``headers`` (its headers as JSON, when it has any) and
``created_at``. Entry ids are Redis's own (``*``): event ids are drawn at
insert, not commit, so ids derived from them would not grow in the order
events are delivered.

Exactly-once handoff: a chunk is appended by one Lua script, which Redis runs
atomically. For each event it first looks for the event's mark among
the subscription's deduplication marks (``pgferry:dedup:<instance>:<subscription>:<n>``,
the instance being the install's name, ferry.config.instance, migration 0034,
hashes of ``<webhook-id>:<stream tag>`` to entry id, an empty one counting as none, one per
``dedup_window`` seconds, kept for two windows) and appends only if the mark is not there,
recording it in the same script. The stream tag (``stream_tag``) is a hash of the stream key
the event goes to, so a mark holds back only the same event to the same stream: keyed by the
webhook-id alone, a subscription moved to another stream and replayed inside the window stored
nothing there. Relays before that read and wrote marks of the webhook-id alone, which this
version neither reads nor writes (nor they this version's): during a rolling upgrade a chunk
re-sent inside the window by a relay of the other version can be stored twice, never lost.
A chunk re-sent after a relay died between Redis's answer and pgferry's bookkeeping appends
nothing twice, for at least ``dedup_window`` seconds (120 by default, JetStream's default duplicate window). The marks
cost about 110 bytes of Redis memory per event, kept two windows: ~260 MB at
10,000 events/s with the default window.

The window ``<n>`` is Redis's: the script reads the server's ``TIME`` and
refuses to run (``pgferry-clock <seconds> <microseconds>``, before it writes
anything) when the marks it was handed are not those of the server's current
window; the relay then takes the server's time from the refusal and sends
again. With the relay's own clock, a relay on a host whose clock was off by
more than a window wrote its marks where the others never looked, and a
chunk re-sent by another relay was stored twice (test_sinks). The mark keys
are still computed by the relay and passed as ``KEYS``, so that a Redis
Cluster can route the script: on a cluster every key of a script must be in
one hash slot, and one subscription's streams and marks would need a common
``{hash tag}``; pgferry is tested against a single server.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import hiredis
import orjson

from pgferry.delivery import request
from pgferry.delivery.brokers import BrokerUnreachable
from pgferry.delivery.destinations import BadDestination, RedisDestination, parse_redis
from pgferry.delivery.health import Endpoint
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription, utf8_length
from pgferry.delivery.redis_pipe import RedisError, RedisPipe
from pgferry.delivery.sink import Prepared, Sink

if TYPE_CHECKING:
    from pgferry.delivery.context import DeliveryContext

#: KEYS: the marks of the server's current window and of the one before it, then one stream key per event.
#: ARGV: the window in seconds, the current window's number, MAXLEN (0: none), then per event:
#: its mark (``<webhook-id>:<stream_tag of its stream key>``), number of fields, field/value pairs.
#: The marks are looked up (HMGET) and written (HSET) once per chunk, not per event: ~8% less of
#: Redis's CPU per event than four calls per event (7.7 -> 7.0 us; an XADD alone costs 2.9).
APPEND_ONCE = """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes (Redis 5 and 6)
local window = tonumber(ARGV[1])
local now = redis.call('TIME')
if math.floor(tonumber(now[1]) / window) ~= tonumber(ARGV[2]) then
    return redis.error_reply('pgferry-clock ' .. now[1] .. ' ' .. now[2])
end
local maxlen = tonumber(ARGV[3])
local ids, starts = {}, {}
local at = 4
for k = 3, #KEYS do
    ids[#ids + 1] = ARGV[at]
    starts[#starts + 1] = at
    at = at + 2 + 2 * tonumber(ARGV[at + 1])
end
local current = redis.call('HMGET', KEYS[1], unpack(ids))
local previous = redis.call('HMGET', KEYS[2], unpack(ids))
local marks, taken = {}, {}
local added, writable = 0, false
for j = 1, #ids do
    local id = ids[j]
    if (not current[j] or current[j] == '') and (not previous[j] or previous[j] == '') and not taken[id] then
        if not writable then
            -- Before the first XADD, the writes of the marks: a script that fails part-way keeps
            -- what it wrote, so a user not allowed HSET or EXPIRE on them appended the chunk at
            -- every try (and without EXPIRE the hash stayed for good). Here it fails having
            -- written nothing; the id's empty mark counts as none until its entry's replaces it.
            -- The first write is HSET, which Redis checks against maxmemory: a script (without
            -- flags) that has written is not checked again, and with EXPIRE first (not checked)
            -- the XADDs went on past maxmemory with noeviction (outside probe). EXPIRE's
            -- permission is asked first where Redis can tell (7.0 and later).
            if redis.acl_check_cmd and not redis.acl_check_cmd('EXPIRE', KEYS[1], '1') then
                return redis.error_reply("NOPERM this user has no permissions to run the 'expire' command")
            end
            redis.call('HSET', KEYS[1], id, '')
            redis.call('EXPIRE', KEYS[1], 2 * window)
            writable = true
        end
        taken[id] = true
        local s = starts[j]
        local args = {KEYS[j + 2]}
        if maxlen > 0 then
            args[#args + 1] = 'MAXLEN'
            args[#args + 1] = '~'
            args[#args + 1] = maxlen
        end
        args[#args + 1] = '*'
        for i = s + 2, s + 1 + 2 * tonumber(ARGV[s + 1]) do
            args[#args + 1] = ARGV[i]
        end
        local ok, entry = pcall(redis.call, 'XADD', unpack(args))
        if not ok then  -- the appends before it stay, marked: a chunk sent again skips them
            if #marks > 0 then redis.call('HSET', KEYS[1], unpack(marks)) end
            return redis.error_reply('pgferry-stream ' .. KEYS[j + 2] .. ' ' .. (entry.err or tostring(entry)))
        end
        marks[#marks + 1] = id
        marks[#marks + 1] = entry
        added = added + 1
    end
end
if #marks > 0 then redis.call('HSET', KEYS[1], unpack(marks)) end
redis.call('EXPIRE', KEYS[1], 2 * window)
return added
"""


APPEND_ONCE_SHA = hashlib.sha1(APPEND_ONCE.encode()).hexdigest()


#: Times a chunk is sent again when the script refuses it for the window (the server's clock
#: crossed into the next window on the way, or it or this host's clock jumped).
CLOCK_TRIES = 3


async def append_once(
    pipe: RedisPipe, marks: str, window: int, maxlen: int, streams: Sequence[str], entries: Sequence[Any]
) -> None:
    """Runs APPEND_ONCE (loading it first on a server that does not know it yet) with the marks
    of the server's current window, as this host's clock and the server's last refusal tell.

    The command is packed by hiredis (C): redis-py's own packing in Python took about half
    of a relay's CPU when appending 100-event chunks (py-spy; docs/benchmarks.md)."""
    text = ""
    for _ in range(CLOCK_TRIES):
        bucket = int((time.time() + pipe.clock_offset) // window)
        keys = (f"{marks}{bucket}", f"{marks}{bucket - 1}", *streams)
        packed = hiredis.pack_command(("EVALSHA", APPEND_ONCE_SHA, len(keys), *keys, window, bucket, maxlen, *entries))
        try:
            try:
                await pipe.send(packed)
            except RedisError as exc:
                if not str(exc).startswith("NOSCRIPT"):
                    raise
                await pipe.call("SCRIPT", "LOAD", APPEND_ONCE)
                await pipe.send(packed)
            return
        except RedisError as exc:
            text = str(exc)
            if not text.startswith("pgferry-clock "):
                raise
            seconds, micros = text.split()[1:3]
            pipe.clock_offset = int(seconds) + int(micros) / 1e6 - time.time()
    raise RedisError(f"Redis's clock kept moving to another deduplication window ({text}); will try again")


@functools.lru_cache(maxsize=4096)
def stream_tag(stream: str) -> str:
    """What an event's mark holds of the stream key it was appended to: 64 bits of its BLAKE2b
    hash, in hex. A mark is ``<webhook-id>:<tag>``, so it holds back only the same event appended
    to the same stream key. Keyed by the webhook-id alone, a mark held back the event's append to
    any stream of the subscription: moved from ``stream=mv:a`` to ``stream=mv:b`` and replayed
    inside the window, no event reached ``mv:b`` and each was recorded delivered (outside probe).
    A hash, not the key itself: a mark's size does not grow with the key's."""
    return hashlib.blake2b(stream.encode(), digest_size=8).hexdigest()


def entry_fields(event: OutEvent, created_at: str) -> list[str]:
    """The entry's field/value pairs, flat; ``created_at``: the event's, as ``timestamp`` writes it."""
    fields = ["webhook-id", request.message_id((event,)), "stream", event.stream]
    if event.key is not None:
        fields += ["key", event.key]
    fields += ["payload", event.payload]
    if event.headers is not None:
        fields += ["headers", event.headers]
    fields += ("created_at", created_at)
    return fields


def timestamp(created_at: datetime) -> str:
    """An entry's created_at: ISO 8601, as orjson writes it."""
    return orjson.dumps(created_at)[1:-1].decode()


class RedisStreamsSink(Sink):
    def __init__(self, sub: Subscription, ctx: DeliveryContext) -> None:
        super().__init__(sub, ctx)
        self.dest: RedisDestination | None = None
        self.problem: str | None = None
        try:
            self.dest = parse_redis(sub.url)
        except BadDestination as exc:  # ferry.subscribe checks the URL: only a row edited by hand gets here
            self.problem = f"subscription URL: {exc}"
        #: where its marks are: without the install's name, two databases' subscriptions of one
        #: name skipped each other's events as duplicates (outside probe)
        self.marks = f"pgferry:dedup:{ctx.instance}:{sub.name}:" if ctx.instance else f"pgferry:dedup:{sub.name}:"

    @property
    def endpoint(self) -> Endpoint | None:
        return ("redis", self.dest.host, self.dest.port) if self.dest is not None else None

    def prepare(self, chunk: Sequence[OutEvent]) -> Prepared | HttpResult:
        if self.dest is None:
            return HttpResult(None, "config", self.problem, None, 0.0)
        streams: list[str] = []
        entries: list[Any] = []
        stamped, stamp = None, ""
        for e in chunk:
            if e.created_at != stamped:  # the events of one transaction share it
                stamped, stamp = e.created_at, timestamp(e.created_at)
            fields = entry_fields(e, stamp)
            # In bytes, as Redis stores them: counted in characters, an entry of non-ASCII text
            # passed here up to four times over the limit.
            size = sum(map(utf8_length, fields))
            if size > self.ctx.max_body_bytes:
                error = (f"entry of event {e.id} is {size} bytes, over the relay's limit of "
                         f"{self.ctx.max_body_bytes} (ferry.config.max_body_bytes)")  # fmt: skip
                return HttpResult(None, "too_large", error, None, 0.0)
            stream = self.dest.stream.render(e, subject=False)
            streams.append(stream)
            entries += [f"{fields[1]}:{stream_tag(stream)}", len(fields) // 2, *fields]
        return streams, entries

    async def send(
        self, chunk: Sequence[OutEvent], prepared: Prepared, on_wire: Callable[[], bool] | None, *, fresh: bool
    ) -> HttpResult:
        assert self.dest is not None
        dest = self.dest
        streams, entries = prepared
        started = time.perf_counter()
        if fresh:
            self.ctx.brokers.forget("redis", dest.host, dest.port)
        try:
            pipe = await self.ctx.brokers.redis(dest.host, dest.port, dest.db, self.sub.credentials)
        except BrokerUnreachable as exc:
            return _failed(exc.error_class, str(exc), started)
        if on_wire is not None and not on_wire():
            return HttpResult(None, "withdrawn", "not sent", None, 0.0)
        try:
            async with asyncio.timeout(self.sub.timeout_ms / 1000):
                await append_once(pipe, self.marks, dest.dedup_window_s, dest.maxlen or 0, streams, entries)
        except (TimeoutError, RedisError, OSError) as exc:
            if isinstance(exc, OSError):  # RedisConnectionLost too
                self.ctx.brokers.forget("redis", dest.host, dest.port)
            return _explain(exc, dest, streams[0], self.sub.timeout_ms, started)
        return HttpResult(None, None, None, None, (time.perf_counter() - started) * 1000)

    def endpoint_down(self) -> None:
        if self.dest is not None:
            self.ctx.brokers.forget("redis", self.dest.host, self.dest.port)


def _explain(exc: BaseException, dest: RedisDestination, stream: str, timeout_ms: int, started: float) -> HttpResult:
    """What a failed append to ``stream`` is recorded as."""
    text = str(exc)
    if isinstance(exc, TimeoutError):
        return _failed("timeout", f"no answer from Redis at {dest.address} within {timeout_ms} ms", started)
    if isinstance(exc, RedisError):
        if exc.kind == "auth":
            return _failed("auth", f"Redis at {dest.address}: {text}", started)
        if exc.kind == "unready":  # held as down and probed, like no answer
            return _failed("connect", f"Redis at {dest.address} cannot serve yet: {text}", started)
        if text.startswith("pgferry-stream "):  # APPEND_ONCE names the stream that refused
            stream, _, text = text.removeprefix("pgferry-stream ").partition(" ")
        if "OOM" in text:
            return _failed("rejected", f"Redis at {dest.address} is out of memory (maxmemory): {text}", started)
        return _failed("rejected", f"Redis at {dest.address} refused the append to {stream!r}: {text}", started)
    return _failed("connect", f"Redis at {dest.address}: {type(exc).__name__}: {text}", started)


def _failed(error_class: str, error: str, started: float) -> HttpResult:
    return HttpResult(None, error_class, error, None, (time.perf_counter() - started) * 1000)
