"""A small, fast HTTP receiver for the demo, the tests and the benchmarks.

Written on asyncio's Protocol API rather than a web framework so a test can
make it misbehave exactly (answer 500, drop the connection, hang, answer
garbage, answer slowly, close after the headers) and so that, in benchmarks, it is not the bottleneck. It speaks
just enough HTTP/1.1: keep-alive, Content-Length bodies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast


@dataclass(frozen=True, slots=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the request was complete


@dataclass(frozen=True, slots=True)
class Respond:
    status: int = 200
    body: bytes = b"ok"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Drop:
    """Close the connection without answering."""


@dataclass(frozen=True, slots=True)
class Hang:
    """Never answer (until the client gives up or the receiver stops)."""


@dataclass(frozen=True, slots=True)
class Garbage:
    """Answer bytes that are not HTTP, then close."""


@dataclass(frozen=True, slots=True)
class CutBody:
    """Answer headers promising a body, send ``body_bytes`` of it (0: close right after the headers)."""

    body_bytes: int = 100


@dataclass(frozen=True, slots=True)
class Slow:
    """Answer ``then`` only after ``seconds`` (a slow receiver). If the client gave up and
    closed meanwhile, nothing is answered and nothing counts as received."""

    seconds: float
    then: Respond = Respond()


Action = Respond | Drop | Hang | Garbage | CutBody | Slow
Behaviour = Callable[[Received], Action]

_REASONS = {200: "OK", 201: "Created", 204: "No Content", 302: "Found", 400: "Bad Request", 410: "Gone",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


def always_ok(_: Received) -> Action:
    return Respond()


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    open: set[asyncio.Transport] = field(default_factory=set)


class _Protocol(asyncio.Protocol):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None  # None once we stopped answering
        self._own: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave like one.
        self.transport = self._own = cast(asyncio.Transport, transport)
        self.receiver.stats.connections += 1
        self.receiver.stats.open.add(self._own)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            method, path, *_ = head[0].split(" ")
            self._handle(Received(method, path, headers, body, time.time()))

    def _handle(self, request: Received) -> None:
        assert self.transport is not None
        self.receiver.stats.requests += 1
        action = self.receiver.behaviour(request)
        if isinstance(action, Respond):
            self._respond(self.transport, request, action)
        elif isinstance(action, Slow):
            # Requests on one connection are answered in order: stop reading until this one is.
            transport, self.transport = self.transport, None
            transport.pause_reading()

            def later() -> None:
                if transport.is_closing():
                    return
                self._respond(transport, request, action.then)
                self.transport = transport
                transport.resume_reading()
                self.data_received(b"")

            asyncio.get_running_loop().call_later(action.seconds, later)
        elif isinstance(action, Drop):
            self.transport.close()
            self.transport = None
        elif isinstance(action, CutBody):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * action.body_bytes)
            self.transport.close()
            self.transport = None
        elif isinstance(action, Garbage):
            self.transport.write(b"\x00\x01 this is not HTTP \xff\r\n\r\n")
            self.transport.close()
            self.transport = None
        else:
            # Hang: read on (and ignore) so a client that gives up and closes is noticed.
            self.transport = None

    def _respond(self, transport: asyncio.Transport, request: Received, action: Respond) -> None:
        if self.receiver.keep and 200 <= action.status < 300:
            self.receiver.received.append(request)
        extra = "".join(f"{k}: {v}\r\n" for k, v in action.headers)
        reason = _REASONS.get(action.status, "Status")
        transport.write(
            f"HTTP/1.1 {action.status} {reason}\r\ncontent-length: {len(action.body)}\r\n{extra}\r\n".encode()
            + action.body
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._own is not None:
            self.receiver.stats.open.discard(self._own)


class Receiver:
    """``await Receiver().start()`` returns its URL; ``received`` lists requests answered with 2xx."""

    def __init__(self, behaviour: Behaviour = always_ok, *, keep: bool = True) -> None:
        self.behaviour = behaviour
        self.keep = keep
        self.received: list[Received] = []
        self.stats = Stats()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0, path: str = "/hook") -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(self), host, port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"http://{host}:{self.port}{path}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for transport in self.stats.open:
                transport.close()
            self.stats.open.clear()
            await self._server.wait_closed()
            self._server = None
