"""The webhook hot path: HTTP/1.1 POSTs over kept-alive connections, parsed by httptools.

Profiling the relay showed aiohttp's per-request bookkeeping as most of the
CPU a delivery costs (~120 us of ~150 us), which on a two-core machine that
also runs PostgreSQL is what decides whether deliveries keep up with
inserts. Webhook delivery needs a narrow slice of HTTP: POST a body of
known length to one endpoint, read status, a couple of headers and the start
of the body, reuse the connection. This module does exactly that on asyncio's
Protocol API, with httptools (the C parser behind uvicorn, by uvloop's
authors) doing the parsing. Everything else (redirects, whole responses, any
method) stays with aiohttp in ``delivery.http``.

Results and error classes are the same ``HttpResult`` values as the aiohttp
sender's, so the rest of the engine cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

import httptools

from pgferry.delivery.addresses import DEFAULT_POLICY, AddressPolicy, RefusedAddress, allowed_addresses
from pgferry.delivery.http import RESPONSE_SNIPPET_BYTES, HttpResult, endpoint_of, parse_retry_after

_USER_AGENT = b"pgferry"
#: the most a response's status line and headers may take
MAX_HEAD_BYTES = 64 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


class _Lost(Exception):
    """The connection ended before a complete response."""

    def __init__(self, got_bytes: bool, reason: str) -> None:
        super().__init__(reason)
        self.got_bytes = got_bytes


class _BadResponse(Exception):
    """What came back is not HTTP."""


@dataclass
class _Response:
    status: int = 0
    reason: str = ""
    retry_after: str | None = None
    location: str | None = None
    body: bytearray = field(default_factory=bytearray)
    keep_alive: bool = False


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[_Response] | None = None
        self.response = _Response()
        self.got_bytes = False
        self.closed = False
        self.head_bytes = 0  # received before the end of the response headers

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports quack like Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no Nagle delay on the last segment of a large body
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_BadResponse(f"invalid HTTP response: {exc}"))
            self.close()
            return
        if self.head_bytes >= 0:  # the headers have not ended yet
            # httptools buffers a header until it ends: a receiver sending one endless
            # header would grow the relay's memory until the timeout (aiohttp stops at 8 KB).
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._fail(_BadResponse(f"invalid HTTP response: headers longer than {MAX_HEAD_BYTES} bytes"))
                self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reason = f"connection error: {exc}" if exc else "server closed the connection"
        self._fail(_Lost(self.got_bytes, reason))

    # httptools callbacks
    def on_status(self, reason: bytes) -> None:
        self.response.reason = reason.decode("latin-1", "replace")

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self.response.retry_after = value.decode("latin-1")
        elif lowered == b"location":
            self.response.location = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head_bytes = -1
        self.response.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        room = RESPONSE_SNIPPET_BYTES - len(self.response.body)
        if room > 0:
            self.response.body += body[:room]

    def on_message_complete(self) -> None:
        self.response.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.response)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    async def request(self, data: bytes, deadline: float) -> _Response:
        """Send ``data`` and wait for the response until ``deadline`` (loop time), then TimeoutError.

        One timer on the loop instead of an ``asyncio.timeout`` block: the block costs about
        twice as much, and a request's timer is the only one most deliveries need."""
        assert self.transport is not None
        self.response = _Response()
        self.got_bytes = False
        self.head_bytes = 0
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_at(deadline, self._expire)
        self.transport.write(data)
        try:
            return await self.waiter
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self._fail(TimeoutError())
        self.close()  # the answer may still come; this connection cannot carry another request

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Pool:
    """Kept-alive connections to one endpoint; at most ``size`` open, one request each."""

    def __init__(self, scheme: str, host: str, port: int, size: int, policy: AddressPolicy) -> None:
        self.host, self.port = host, port
        self.policy = policy
        self.ssl = ssl.create_default_context() if scheme == "https" else None
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(size)
        default_port = 443 if scheme == "https" else 80
        self.host_header = (host if port == default_port else f"{host}:{port}").encode("idna")

    def take_idle(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self) -> _Connection:
        """Resolve, refuse forbidden addresses, then connect to one allowed address itself."""
        loop = asyncio.get_running_loop()
        last_error: OSError | None = None
        for _, ip in await allowed_addresses(self.host, self.port, self.policy):
            try:
                _, conn = await loop.create_connection(
                    _Connection, ip, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
                )
                return conn
            except OSError as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    def give_back(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.closed:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


@lru_cache(maxsize=1024)
def _valid_name(name: str) -> bool:
    """Whether ``name`` is an HTTP header name (a token); the same few names come with every request."""
    return _TOKEN.match(name) is not None


@lru_cache(maxsize=4096)
def _target(url: str) -> tuple[tuple[str, str, int], bytes]:
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in url for c in "\r\n\t\0 "):  # urlsplit silently drops some of these
        raise ValueError("URL contains whitespace or control characters")
    return endpoint_of(url), path.encode("ascii", "strict")


class FastSender:
    """POSTs for webhook delivery over per-endpoint pools of kept-alive connections."""

    def __init__(self, *, pool_size: int = 64, policy: AddressPolicy = DEFAULT_POLICY) -> None:
        self.pool_size = pool_size
        self.policy = policy
        self._pools: dict[tuple[str, str, int], _Pool] = {}

    def _pool(self, endpoint: tuple[str, str, int]) -> _Pool:
        pool = self._pools.get(endpoint)
        if pool is None:
            pool = self._pools[endpoint] = _Pool(*endpoint, self.pool_size, self.policy)
        return pool

    async def send(  # noqa: PLR0911 - one return per way a request can end
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
    ) -> HttpResult:
        started = time.perf_counter()

        def done(status: int | None, error_class: str | None, error: str | None, response: str | None = None,
                 retry_after: float | None = None) -> HttpResult:  # fmt: skip
            return HttpResult(status, error_class, error, response, (time.perf_counter() - started) * 1000, retry_after)

        try:
            endpoint, path = _target(url)
        except (ValueError, UnicodeError) as exc:
            return done(None, "bad_request", f"cannot send to {url!r}: {exc}")
        pool = self._pool(endpoint)
        try:
            head = [b"POST ", path, b" HTTP/1.1\r\nHost: ", pool.host_header, b"\r\nUser-Agent: ", _USER_AGENT,
                    b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n"]  # fmt: skip
            for name, value in headers.items():
                # Last line of defence against header injection: whatever the
                # SQL checks let through, no CR/LF/NUL reaches the wire.
                if not _valid_name(name):
                    return done(None, "bad_request", f"header name {name[:100]!r} is not a valid HTTP header name")
                if "\r" in value or "\n" in value or "\0" in value:
                    return done(None, "bad_request", f"header {name!r} contains a line break or NUL; not sent")
                head += [name.encode("latin-1"), b": ", value.encode("utf-8"), b"\r\n"]
        except UnicodeError as exc:
            return done(None, "bad_request", f"header cannot be sent: {exc}")
        data = b"".join([*head, b"\r\n", body])

        async with pool.slots:
            deadline = asyncio.get_running_loop().time() + timeout  # the wait for a slot does not count
            try:
                response = await self._exchange(pool, data, connect_timeout, deadline)
            except TimeoutError:
                return done(None, "timeout", f"no complete answer within {timeout:g} s")
            except socket.gaierror as exc:
                return done(None, "dns", f"cannot resolve host {endpoint[1]!r}: {exc}")
            except RefusedAddress as exc:
                return done(None, "refused_address", str(exc))
            except _ConnectTimeout:
                return done(
                    None, "timeout", f"cannot connect to {endpoint[1]}:{endpoint[2]} within {connect_timeout:g} s"
                )
            except ssl.SSLError as exc:
                return done(None, "tls", f"TLS error with {endpoint[1]}:{endpoint[2]}: {exc.reason or exc}")
            except _Lost as exc:
                if exc.got_bytes:
                    return done(None, "reset", f"response cut off: {exc}")
                return done(None, "empty_reply", "server closed the connection without a complete response")
            except _BadResponse as exc:
                return done(None, "invalid_response", str(exc))
            except OSError as exc:
                return done(None, "connect", f"cannot connect to {endpoint[1]}:{endpoint[2]}: {exc.strerror or exc}")

        status = response.status
        if 200 <= status < 300:
            return done(status, None, None)
        snippet = response.body.decode("utf-8", "replace")
        if 300 <= status < 400:
            return done(
                status, "redirect", f"HTTP {status} redirect to {response.location or '?'} (not followed)", snippet
            )
        error = f"HTTP {status} {response.reason}".strip()
        return done(status, "http_status", error, snippet, parse_retry_after(response.retry_after))

    async def _exchange(self, pool: _Pool, data: bytes, connect_timeout: float, deadline: float) -> _Response:
        conn = pool.take_idle()
        reused = conn is not None
        if conn is None:
            conn = await _connect(pool, connect_timeout, deadline)
        try:
            response = await conn.request(data, deadline)
        except _Lost as exc:
            pool.give_back(conn, reusable=False)
            if not (reused and not exc.got_bytes):
                raise
            # The server closed a kept-alive connection just as we reused it:
            # nothing was processed, so one fresh connection is safe to try.
            conn = await _connect(pool, connect_timeout, deadline)
            try:
                response = await conn.request(data, deadline)
            except BaseException:
                pool.give_back(conn, reusable=False)
                raise
        except BaseException:
            pool.give_back(conn, reusable=False)
            raise
        pool.give_back(conn, reusable=response.keep_alive)
        return response

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


class _ConnectTimeout(Exception):
    pass


async def _connect(pool: _Pool, connect_timeout: float, deadline: float) -> _Connection:
    """A new connection within ``connect_timeout`` (_ConnectTimeout) and before the request's
    ``deadline`` (TimeoutError), whichever comes first."""
    remaining = deadline - asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(min(connect_timeout, remaining)):
            return await pool.connect()
    except TimeoutError:
        if connect_timeout < remaining:
            raise _ConnectTimeout from None
        raise
