"""A TCP proxy between two loopback endpoints that can misbehave on command.

The fault tests put it between the relay and PostgreSQL, or between the relay
and a receiver, to produce the network faults real deployments see:

* ``cut(rst=True)``: every open connection is reset (RST), as when a firewall
  or a failed-over load balancer drops its state; ``rst=False`` closes them
  with a FIN instead, as a server-side idle reaper would.
* ``blackhole()``: bytes are still accepted but go nowhere, in both
  directions, on open and new connections: the peers stall mid-request. The
  connections that were black-holed stay so even after ``resume()`` and their
  other side is never told they ended (closing one side does not close the
  other), like a TCP path lost in a network partition: PostgreSQL keeps such
  a backend, and whatever it holds, until something times it out.
* ``stall()``: stop forwarding but keep the bytes (TCP backpressure); after
  ``resume()`` everything flows on, as after a short network hiccup.
* ``starting()``: new connections are answered as PostgreSQL answers while it
  starts up or recovers (FATAL 57P03), never passed on.
* ``resume()``: new connections pass again (and stalled ones continue).

It only ever listens on and connects to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["pass", "blackhole", "stall", "starting"]
#: PostgreSQL's startup answer while it starts up: an ErrorResponse, FATAL, SQLSTATE 57P03
_STARTING_FIELDS = b"SFATAL\x00VFATAL\x00C57P03\x00Mthe database system is starting up\x00\x00"
_SSL_REQUEST = 80877103


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side and the upstream side."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    blackholed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


class FaultProxy:
    """``port = await FaultProxy(target_port).start()``; then ``cut()``, ``blackhole()``, ``stall()``, ``resume()``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        assert target_host == "127.0.0.1", "the fault proxy only talks to loopback"
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self.port = 0
        self.links: set[_Link] = set()
        self.accepted = 0
        self.cuts = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def url_for(self, url: str) -> str:
        """``url`` (PostgreSQL or HTTP, on 127.0.0.1:target) rewritten to go through the proxy."""
        needle = f"127.0.0.1:{self.target[1]}"
        assert needle in url, f"{url} does not point at {needle}"
        return url.replace(needle, f"127.0.0.1:{self.port}", 1)

    @property
    def open_links(self) -> int:
        return len(self.links)

    # -- commands -----------------------------------------------------------

    def cut(self, *, rst: bool = True) -> int:
        """End every open connection now (both sides); returns how many."""
        links = list(self.links)
        for link in links:
            self._close(link, rst=rst)
        self.cuts += len(links)
        return len(links)

    def blackhole(self) -> None:
        self.mode = "blackhole"
        for link in self.links:
            link.blackholed = True
        self._flowing.set()  # stalled bytes are now discarded rather than held

    def stall(self) -> None:
        self.mode = "stall"
        self._flowing.clear()

    def starting(self) -> None:
        self.mode = "starting"

    def resume(self) -> None:
        self.mode = "pass"
        self._flowing.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            self._close(link, rst=False)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- plumbing -----------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(client=writer, blackholed=self.mode == "blackhole")
        self.links.add(link)
        link.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            if self.mode == "starting":
                await _answer_starting(reader, writer)
                return
            if not link.blackholed:
                await self._flowing.wait()
            if link.blackholed:
                # Accept and swallow, never connect upstream: the client waits for an answer forever.
                await self._pump(reader, None, link)
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            link.upstream = up_writer
            other = asyncio.create_task(self._pump(up_reader, writer, link))
            link.tasks.append(other)
            await self._pump(reader, up_writer, link)
            await asyncio.gather(other, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # cut() or stop() ended this link; end the handler quietly (asyncio's
            # stream server logs a cancelled handler as an error).
            pass
        finally:
            if not link.blackholed:
                self._close(link, rst=False)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, link: _Link) -> None:
        """Copy src to dst until EOF, honouring stall and black-hole."""
        while True:
            if not link.blackholed:
                await self._flowing.wait()
            try:
                data = await src.read(65536)
            except OSError:
                data = b""
            if not data:
                if link.blackholed:
                    # A partition: the other side never learns this one went away.
                    await asyncio.Event().wait()
                break
            if link.blackholed or dst is None:
                continue
            if not self._flowing.is_set():
                await self._flowing.wait()
                if link.blackholed:
                    continue
            dst.write(data)
            await dst.drain()
        if dst is not None and not link.blackholed:
            with contextlib.suppress(OSError, RuntimeError):
                if dst.can_write_eof():
                    dst.write_eof()

    def _close(self, link: _Link, *, rst: bool) -> None:
        if link not in self.links:
            return
        self.links.discard(link)
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()
        for writer in link.writers():
            if rst:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()


async def _answer_starting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the client's startup packet (after declining TLS) and answer 57P03, as PostgreSQL does."""
    (length,) = struct.unpack("!I", await reader.readexactly(4))
    body = await reader.readexactly(length - 4)
    if struct.unpack("!I", body[:4])[0] == _SSL_REQUEST:
        writer.write(b"N")
        (length,) = struct.unpack("!I", await reader.readexactly(4))
        await reader.readexactly(length - 4)
    writer.write(b"E" + struct.pack("!I", len(_STARTING_FIELDS) + 4) + _STARTING_FIELDS)
    await writer.drain()
