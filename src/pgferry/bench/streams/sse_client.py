"""Many streams-API clients in one process, for `pgferry bench streams`: `python -m pgferry.bench.streams.sse_client`.

Why a process of its own: on two cores the clients must not share the
relay's event loop, nor take its CPU unnoticed; the bench reads this
process's CPU from /proc. Why raw sockets and a minimal parser: a thousand
aiohttp sessions would cost more CPU than the relay serving them, and the
bench would measure its own clients. Each connection is an ``asyncio.Protocol``
speaking just enough HTTP/1.1 (status line, chunked or close-delimited body)
and SSE (the frames the relay writes: ``id:``/``data:``, ``event: end``,
``event: error``, ``retry:``, ``:`` comments) to count what arrives.

Modes:

- ``follow``: one connection per stream, each from the stream's beginning, until
  every stream's ``end`` event (the bench closes the streams after the load) or
  SIGTERM. Each event's ``payload.t`` (a wall-clock stamp, seconds) gives its
  latency: the wall time when its bytes arrived here minus the stamp.
- ``catchup``: the same for one stream without decoding payloads: counts frames
  and checks offsets only ascend (a repeat would not), timing the read.
- ``poll``: one stream through the JSON long-poll route, ``limit`` events a
  request, from the beginning until ``closed``.

Once every connection has its first bytes (HTTP 200 and the ``retry:`` frame the
relay writes after admitting it) or has failed, one line ``ready {...}`` goes
to stdout; the results go to ``--out`` as JSON when the process ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import orjson

#: Seconds one connection may take to be admitted (a storm's stragglers wait in the listen backlog).
CONNECT_TIMEOUT_S = 180.0


class ChunkedDecoder:
    """Transfer-Encoding: chunked, decoded incrementally (sizes in hex, each chunk followed by CRLF)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.left = 0  # data bytes left in the current chunk
        self.skip = 0  # bytes of the CRLF after a chunk left to skip
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buffer + data if self.buffer else data
        pos, out = 0, []
        while not self.done and pos < len(buf):
            if self.left:
                piece = buf[pos : pos + self.left]
                out.append(piece)
                pos += len(piece)
                self.left -= len(piece)
                if not self.left:
                    self.skip = 2
                continue
            if self.skip:
                step = min(self.skip, len(buf) - pos)
                pos += step
                self.skip -= step
                continue
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(buf[pos:line_end].split(b";", 1)[0], 16)
            pos = line_end + 2
            if size == 0:
                self.done = True
            self.left = size
        self.buffer = buf[pos:]
        return b"".join(out)


@dataclass
class Tally:
    """What every connection of this process saw."""

    started: float = field(default_factory=time.time)
    statuses: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    #: seconds from the start to each connection's first bytes (HTTP 200 and the retry frame)
    connect_s: list[float] = field(default_factory=list)
    ended: int = 0
    errors: int = 0  # ``event: error`` frames (a client the relay let go)
    heartbeats: int = 0
    events: int = 0
    duplicates: int = 0  # an offset not after the previous one on its connection
    #: (arrival wall time, latency ms) per event, when payloads are decoded
    latencies: list[tuple[float, float]] = field(default_factory=list)
    per_stream: dict[str, int] = field(default_factory=dict)
    first_event_at: float | None = None
    last_event_at: float | None = None
    pending: int = 0  # connections not yet admitted or failed
    open: int = 0  # connections open
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    all_done: asyncio.Event = field(default_factory=asyncio.Event)


class SseConnection(asyncio.Protocol):
    """One SSE response, read as it arrives."""

    def __init__(self, tally: Tally, stream: str, request: bytes, decode: bool) -> None:
        self.tally = tally
        self.stream = stream
        self.request = request
        self.decode = decode
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.body: ChunkedDecoder | None = None
        self.chunked = False
        self.text = b""
        self.admitted = False
        self.finished = False
        self.last = (-1, -1)
        self.count = 0
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self.tally.open += 1
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.body is None and not self.chunked:
            self.head += data
            cut = self.head.find(b"\r\n\r\n")
            if cut < 0:
                return
            head, data = self.head[:cut], self.head[cut + 4 :]
            self.head = b""
            status = head[9:12].decode("latin-1")
            self.tally.statuses[status] += 1
            if status != "200":
                self._settle(f"HTTP {status}")
                self.finish()
                return
            self.chunked = b"transfer-encoding: chunked" in head.lower()
            self.body = ChunkedDecoder() if self.chunked else None
            if not self.chunked:
                self.chunked = True  # close-delimited: the bytes are the body
        text = self.body.feed(data) if self.body is not None else data
        if not text:
            return
        frames = (self.text + text).split(b"\n\n")
        self.text = frames.pop()
        for frame in frames:
            self._frame(frame, now)

    def _frame(self, frame: bytes, now: float) -> None:
        tally = self.tally
        if frame.startswith(b"event: end"):
            tally.ended += 1
            self.finish()
        elif frame.startswith(b"data: "):  # an event: "data: {...}\nid: TICK-ID", the id last
            id_at = frame.rfind(b"\nid: ")
            rest, ident = frame[:id_at], frame[id_at + 5 :]
            tick, _, event_id = ident.partition(b"-")
            offset = (int(tick), int(event_id))
            if offset <= self.last:
                tally.duplicates += 1
                return
            self.last = offset
            self.count += 1
            tally.events += 1
            if tally.first_event_at is None:
                tally.first_event_at = now
            tally.last_event_at = now
            if self.decode:
                stamp = orjson.loads(rest[6:])["payload"].get("t")
                if stamp is not None:
                    tally.latencies.append((now, (now - float(stamp)) * 1000.0))
        elif frame.startswith(b"retry:"):
            self._settle(None)
        elif frame.startswith(b":"):
            tally.heartbeats += 1
        elif frame.startswith(b"event: error"):
            tally.errors += 1
            self.finish()

    def _settle(self, failure: str | None) -> None:
        """Admitted (failure None) or refused: counted once, towards ``ready``."""
        if self.admitted:
            return
        self.admitted = True
        if failure is None:
            self.tally.connect_s.append(time.time() - self.tally.started)
        else:
            self.tally.failures[failure] += 1
        self.tally.pending -= 1
        if self.tally.pending == 0:
            self.tally.ready.set()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.tally.per_stream[self.stream] = self.count
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.tally.open -= 1
        if not self.admitted:
            self._settle(f"closed before admitted: {type(exc).__name__ if exc else 'EOF'}")
        elif not self.finished:
            self.tally.failures["closed before the end"] += 1
        self.finish()
        if not self.closed.done():
            self.closed.set_result(None)


def request(host: str, port: int, path: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
    ).encode()


async def open_one(tally: Tally, host: str, port: int, stream: str, decode: bool) -> None:
    """Connect, read until the response ends; a failure to connect is counted, not raised."""
    loop = asyncio.get_running_loop()
    path = f"/v1/streams/{quote(stream, safe=':')}"
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, protocol = await loop.create_connection(
                lambda: SseConnection(tally, stream, request(host, port, path), decode), host, port
            )
    except (OSError, TimeoutError) as exc:
        tally.failures[f"connect: {type(exc).__name__}"] += 1
        tally.pending -= 1
        if tally.pending == 0:
            tally.ready.set()
        return
    await protocol.closed


async def follow(host: str, port: int, streams: list[str], decode: bool, timeout: float) -> Tally:
    """Every stream on its own connection, opened at once; until all end, SIGTERM, or ``timeout``."""
    tally = Tally(pending=len(streams))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(open_one(tally, host, port, s, decode)) for s in streams]
    announce = asyncio.create_task(_announce(tally))
    everything = asyncio.gather(*tasks)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({everything, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await everything
    waiter.cancel()
    announce.cancel()
    return tally


async def _announce(tally: Tally) -> None:
    await tally.ready.wait()
    ok = len(tally.connect_s)
    line = {"admitted": ok, "failed": sum(tally.failures.values()), "seconds": max(tally.connect_s, default=0.0)}
    sys.stdout.write("ready " + orjson.dumps(line).decode() + "\n")
    sys.stdout.flush()


async def poll(base: str, stream: str, limit: int) -> dict[str, Any]:
    """Read ``stream`` from its beginning through the long-poll route until it is closed."""
    import aiohttp

    url = f"{base}/v1/streams/{quote(stream, safe=':')}/events"
    events = requests = duplicates = 0
    last = (-1, -1)
    after: str | None = None
    started = time.time()
    first: float | None = None
    async with aiohttp.ClientSession() as session:
        sys.stdout.write("ready {}\n")
        sys.stdout.flush()
        while True:
            params = {"limit": str(limit), **({"after": after} if after else {})}
            async with session.get(url, params=params) as response:
                body = orjson.loads(await response.read())
                if response.status != 200:
                    raise RuntimeError(f"long-poll answered {response.status}: {body}")
            requests += 1
            for event in body["events"]:
                tick, _, event_id = event["offset"].partition("-")
                offset = (int(tick), int(event_id))
                if offset <= last:
                    duplicates += 1
                    continue
                last = offset
                events += 1
            if events and first is None:
                first = time.time()
            after = body["next"]
            if body["closed"]:
                break
    return {
        "events": events,
        "duplicates": duplicates,
        "requests": requests,
        "started": started,
        "first_event_at": first,
        "last_event_at": time.time(),
    }


def _summary(tally: Tally) -> dict[str, Any]:
    return {
        "started": tally.started,
        "statuses": dict(tally.statuses),
        "failures": dict(tally.failures),
        "connect_s": tally.connect_s,
        "ended": tally.ended,
        "errors": tally.errors,
        "heartbeats": tally.heartbeats,
        "events": tally.events,
        "duplicates": tally.duplicates,
        "latencies": tally.latencies,
        "per_stream": tally.per_stream,
        "first_event_at": tally.first_event_at,
        "last_event_at": tally.last_event_at,
    }


def main(argv: list[str]) -> None:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m pgferry.bench.streams.sse_client")
    parser.add_argument("mode", choices=("follow", "catchup", "poll"))
    parser.add_argument("--base", required=True, help="the API's base URL, http://127.0.0.1:PORT")
    parser.add_argument("--stream", required=True, help="a stream name, or a pattern with {} and --count")
    parser.add_argument("--count", type=int, default=1, help="streams {} = 0..count-1, one connection each")
    parser.add_argument("--limit", type=int, default=1000, help="poll: events per request")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--out", required=True, help="write the results here as JSON")
    args = parser.parse_args(argv)
    host, _, port = args.base.removeprefix("http://").partition(":")
    streams = [args.stream.format(i) for i in range(args.count)] if "{}" in args.stream else [args.stream]
    if args.mode == "poll":
        result = uvloop.run(poll(args.base, streams[0], args.limit))
    else:
        tally = uvloop.run(follow(host, int(port), streams, args.mode == "follow", args.timeout))
        result = _summary(tally)
    with open(args.out, "wb") as out:
        out.write(orjson.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
