"""One pipelined connection to a Redis server, shared by every send to it.

redis-py's asyncio pool takes a connection per command, checks it for unread
data, and gives it back: ~15 event-loop steps per command. On two busy cores
that made a relay's single-event appends queue behind each other (p50 0.75-1 s
from commit to store, against ~55 ms for a webhook, at ~1,200 events/s:
docs/benchmarks.md). Redis answers the commands of one connection in the
order they came, so here the commands of one turn of the event loop go out in
one write and one reader hands the replies, in order, to the callers waiting
for them: 3.6K -> 5.4-8K appends/s from one process, 10 callers at a time, in
the same run; in ``bench sinks`` single-event p50 751 -> 144-278 ms, 100-event
chunks 0.54x -> 0.72-0.75x of the webhook's rate (docs/benchmarks.md).

Packing and parsing are hiredis's (C, maintained by Redis); what is ours is
the order of the waiting callers. A caller that stops waiting (its timeout)
leaves its place in the queue: its reply is read and dropped, so the replies
of the others stay theirs. A broken connection fails every caller waiting on
it, and the next send makes a new one (``delivery.brokers``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Any

import hiredis

#: Bytes read from the socket at a time.
READ_SIZE = 1 << 16
#: Commands written at once at most (and then the socket's buffer is let drain).
WRITE_AT_ONCE = 256


class RedisError(Exception):
    """Redis answered a command with an error (``ERR ...``, ``NOSCRIPT ...``, ``OOM ...``, ``WRONGPASS ...``)."""

    @property
    def kind(self) -> str:
        """``auth`` (the login), ``unready`` (a server that cannot serve yet: loading its data
        after a restart, a script running too long, a replica without its primary: retried as
        the server being down, not hammered), or ``refused``."""
        text = str(self)
        if text.startswith(("NOAUTH", "WRONGPASS", "ERR AUTH")):  # ERR AUTH: a password where none is set
            return "auth"
        if text.startswith(("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")):
            return "unready"
        return "refused"


class RedisConnectionLost(ConnectionError):
    """The connection broke, or was closed, before the command's reply came."""


class RedisPipe:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._broken: RedisConnectionLost | None = None
        self._unwritten: list[bytes] = []
        #: seconds this server's clock is ahead of this host's, as the append script last told
        #: (``delivery.redis_streams``: its deduplication windows are the server's)
        self.clock_offset = 0.0
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, ip: str, port: int, db: int, credentials: Mapping[str, str]) -> RedisPipe:
        """A connection, logged in and on database ``db``. Raises RedisError when the server
        refuses the login or the database, OSError when it cannot be reached."""
        reader, writer = await asyncio.open_connection(ip.strip("[]"), port)
        pipe = cls(reader, writer)
        try:
            if "password" in credentials:
                user = credentials.get("user")
                await pipe.call("AUTH", *([user] if user else []), credentials["password"])
            if db:
                await pipe.call("SELECT", db)
            await pipe.call("PING")  # NOAUTH here when the server wants a password none was given for
        except BaseException:
            pipe.close()
            raise
        return pipe

    @property
    def alive(self) -> bool:
        return self._broken is None

    async def send(self, packed: bytes) -> Any:
        """Sends a command packed with ``hiredis.pack_command`` and returns its reply."""
        if self._broken is not None:
            raise self._broken
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(future)
        if not self._unwritten:
            loop.call_soon(self._write)
        self._unwritten.append(packed)
        try:
            if len(self._unwritten) >= WRITE_AT_ONCE:
                self._write()
                await self._writer.drain()  # waits only while the socket's buffer is full
            return await future
        finally:
            future.cancel()  # the caller stopped waiting: its reply will be read and dropped

    async def call(self, *command: str | int | bytes) -> Any:
        return await self.send(hiredis.pack_command(command))  # type: ignore[arg-type]  # its stub wants a 1-tuple

    def _write(self) -> None:
        """One write for the commands of one turn of the event loop: a system call per command
        cost ~165 µs each on this machine's loaded cores."""
        if self._unwritten and self._broken is None:
            self._writer.write(b"".join(self._unwritten))
        self._unwritten.clear()

    def close(self, why: str = "connection closed by pgferry") -> None:
        self._fail(RedisConnectionLost(why))
        self._reading.cancel()
        self._writer.close()

    def _fail(self, error: RedisConnectionLost) -> None:
        if self._broken is None:
            self._broken = error
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(self._broken)

    async def _read(self) -> None:
        parser = hiredis.Reader(replyError=RedisError)
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                if not data:
                    self._fail(RedisConnectionLost("Redis closed the connection"))
                    self._writer.close()
                    return
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if not self._waiting:  # a reply nobody asked for: the order is lost, so is the connection
                        self.close("Redis sent a reply to no command")
                        return
                    future = self._waiting.popleft()
                    if future.done():  # its caller stopped waiting
                        continue
                    if isinstance(reply, RedisError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except (OSError, hiredis.ProtocolError) as exc:
            self._fail(RedisConnectionLost(f"connection to Redis broke: {type(exc).__name__}: {exc}"))
            self._writer.close()
