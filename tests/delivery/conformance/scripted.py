"""A raw-socket HTTP server whose every answer is a script: byte chunks, pauses, a close.

For the answers no well-behaved server gives (interim responses, two answers to one
request, unsolicited bytes, odd framing, stalls). It reads requests properly
(Content-Length bodies, keep-alive) and writes exactly the bytes it is told to, in the
writes it is told to, so the sender's parser sees them split the way the script says.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

_REASONS = {100: "Continue", 101: "Switching Protocols", 103: "Early Hints", 200: "OK", 201: "Created",
            204: "No Content", 304: "Not Modified", 500: "Internal Server Error"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Request:
    connection: int  # which connection it came on: 1 for the server's first, and so on
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection (the rest of the script is not played)."""


@dataclass(frozen=True, slots=True)
class Reset:
    """Abort the connection with a TCP reset (RST), as the kernel of a crashed server does."""


Step = bytes | Pause | Close | Reset
Script = Callable[[Request], Sequence[Step]]


#: the ``scripted`` fixture: ``await scripted(script)`` -> a started server
MakeScripted = Callable[[Script], Awaitable["ScriptedServer"]]


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"


def status_line(status: int, version: str = "HTTP/1.1") -> bytes:
    return f"{version} {status} {_REASONS.get(status, 'Status')}\r\n".encode()


def answer(status: int, body: bytes = b"", *headers: str, version: str = "HTTP/1.1") -> bytes:
    """A complete answer with a Content-Length, plus ``headers`` ("Name: value")."""
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return status_line(status, version) + head.encode() + b"\r\n" + body


def body_for(status: int) -> bytes:
    """What the scripted server says along with ``status``: "boom" for failures, to check ``response``."""
    return b"boom" if status >= 400 else b"fine"


def full(status: int) -> bytes:
    """The scripted server's ordinary answer to a request that asked for ``status``."""
    return answer(status, body_for(status))


def requested_status(request: Request) -> int:
    """The status a request asks for: the last part of its path (``/answer/500``)."""
    return int(request.path.rsplit("/", 1)[-1])


class ScriptedServer:
    """``await ScriptedServer(script).start()``; ``url(path)``; ``requests`` in arrival order."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        number = self.connections
        try:
            while (request := await _read_request(reader, number)) is not None:
                self.requests.append(request)
                if not await _play(self.script(request), writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        except asyncio.CancelledError:  # stop(): end quietly (asyncio logs a cancelled handler as an error)
            return
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader, connection: int) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed between requests
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(connection, method, path, headers, body)


async def _play(steps: Sequence[Step], writer: asyncio.StreamWriter) -> bool:
    """Play ``steps``; False once the connection is (to be) closed."""
    for step in steps:
        if isinstance(step, Close):
            return False
        if isinstance(step, Reset):
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            continue
        if writer.is_closing():
            return False
        writer.write(step)
        await writer.drain()
    return True
