"""pgferry's HTTP/1.1 client: requests over bounded pools of kept-alive connections.

Profiling the relay showed aiohttp's per-request bookkeeping as most of the
CPU a delivery costs (~120 us of ~150 us), which on a two-core machine that
also runs PostgreSQL decides whether deliveries keep up with inserts
(docs/benchmarks.md). Delivery needs a narrow slice of HTTP/1.1: send a
request of known length, read the answer (status, a few headers, the start
of the body, or for the pg_net API all of it), reuse the connection. This
module does that slice on asyncio's Protocol API; ``delivery.http1`` frames
the answers, byte-exact.

What it guarantees, because a wrong answer here records a rejected event as
delivered:
- an answer is attributed only to the request it belongs to: a connection
  is given back to its pool only when its answer ended exactly where the
  framing says and nothing else arrived; bytes nobody asked for, a second
  answer, a framing doubt or a timeout close it;
- an endpoint that sent bytes nobody asked for (a second, late answer) has
  its connections closed after each answer for UNTRUSTED_FOR seconds: a
  late answer that arrived after the next request was written would be
  taken for that request's (HTTP/1.1 cannot tell them apart), so the
  connection it could arrive on is not kept (outside probe: a receiver
  answering every request twice, the second 30 ms late, had 7 of 10
  rejected events recorded as delivered);
- every request that reached the wire is reported: one sent on a kept-alive
  connection that the server had just closed is sent again once on a new
  connection, and the first try comes back in ``HttpResult.earlier``;
- a request that has not reached the wire can be withdrawn (``on_wire``):
  nothing is sent, and the caller knows it was not.

Results and error classes are ``HttpResult`` values (``delivery.http``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import lru_cache
from urllib.parse import urljoin, urlsplit

from pgferry.aio import Slots
from pgferry.delivery.addresses import DEFAULT_POLICY, AddressPolicy, RefusedAddress, allowed_addresses
from pgferry.delivery.http import (
    MAX_CAPTURED_BYTES,
    RESPONSE_SNIPPET_BYTES,
    Captured,
    HttpResult,
    Timings,
    decode_text,
    endpoint_of,
    header_value_fault,
    host_port,
    parse_retry_after,
)
from pgferry.delivery.http1 import NOTHING, PARTIAL, RECV_ERROR, ProtocolError, Response, ResponseReader, Truncated

log = logging.getLogger(__name__)

_USER_AGENT = "\r\nUser-Agent: pgferry"
#: Seconds an idle kept-alive connection is reused when the server did not say how long it keeps
#: one open (aiohttp's default too).
IDLE_LIMIT = 15.0
#: How long before the server's announced idle timeout a connection is no longer reused (at most
#: half of it: Keep-Alive: timeout=1 still allows reuse within half a second).
IDLE_MARGIN = 1.0
#: Seconds an endpoint's connections are closed after each answer once it sent bytes nobody
#: asked for (module docstring): a new connection per request, for a receiver that misbehaves.
UNTRUSTED_FOR = 600.0
#: Idle kept-alive connections one sender keeps over all its endpoints; beyond it, the one idle
#: longest is closed (_IdleConnections). Each endpoint keeps as many as its busiest moment
#: opened (for their idle time), and 1,000 endpoints busiest at different moments held ~19,000
#: open connections in `bench fanout`, the receiver's limit of open files: requests then waited
#: unanswered in its accept queue until they timed out. In flight are at most the relay's
#: max_in_flight (1,024).
MAX_IDLE = 4096
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
#: Methods whose request carries no body unless one is given.
_BODYLESS = frozenset(("GET", "HEAD", "DELETE", "OPTIONS"))
#: Redirects that turn a POST into a GET without a body (what curl and browsers do).
_SEE_OTHER = frozenset((301, 302, 303))
_FOLLOWED = frozenset((301, 302, 303, 307, 308))


class _Lost(Exception):
    """The connection ended before a complete response: closed (or, ``reset``, broken) after
    ``got_bytes`` and ``got_status`` (``http1.Truncated``)."""

    def __init__(self, got_bytes: bool, reason: str, *, got_status: bool = False, reset: bool = False) -> None:
        super().__init__(reason)
        self.got_bytes = got_bytes
        self.got_status = got_status
        self.reset = reset


class _Withdrawn(Exception):
    """The caller took the request back before it reached the wire."""


class _ConnectTimeout(Exception):
    """Connecting (TCP, and for https the TLS handshake) took ``seconds``: the connect timeout,
    or what was left of the request's."""

    def __init__(self, seconds: float, tls: bool) -> None:
        super().__init__(seconds)
        self.seconds = seconds
        self.tls = tls


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time."""

    def __init__(self, pool: _Pool | None = None) -> None:
        self.pool = pool  # told of bytes nobody asked for
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None  # the answer being read; None while idle
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.reusable = True
        #: loop time after which this idle connection is not reused (the server may be closing it)
        self.idle_until = 0.0
        #: what the last answer said of the server's idle timeout (Keep-Alive: timeout=N)
        self.idle_timeout: int | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports quack like Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no Nagle delay on the last segment of a large body
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:  # bytes nobody asked for: this connection can no longer be trusted
            self.close()
            if self.pool is not None and data.strip(b"\r\n"):  # a stray line end is no answer
                self.pool.sent_unasked(data)
            return
        try:
            response = reader.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            self.close()
            return
        if response is not None:
            self._finish(reader, response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader, self.reader = self.reader, None
        if reader is None:
            return
        try:
            response = reader.feed_eof()  # a body delimited by the close ends here
        except Truncated as lost:
            if isinstance(exc, ssl.SSLError):  # a TLS alert, e.g. TLS 1.3's certificate_required: a tls failure
                self._fail(exc)
                return
            reason = f"connection error: {exc}" if exc else "server closed the connection"
            self._fail(_Lost(lost.got_bytes, reason, got_status=lost.got_status, reset=exc is not None))
            return
        self._finish(reader, response)

    def _finish(self, reader: ResponseReader, response: Response) -> None:
        self.reader = None
        self.idle_timeout = response.idle_timeout
        if reader.extra or not response.keep_alive:
            self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        self.reader = None
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    async def request(self, data: bytes, deadline: float, reader: ResponseReader) -> Response:
        """Send ``data`` and wait for its answer until ``deadline`` (loop time), then TimeoutError.

        One timer on the loop instead of an ``asyncio.timeout`` block: the block costs about
        twice as much, and a request's timer is the only one most deliveries need."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.reader = reader
        self.waiter = loop.create_future()
        timer = loop.call_at(deadline, self._expire)
        self.transport.write(data)
        try:
            return await self.waiter
        except BaseException:
            # Cancelled or failed before its answer was read: that answer may still come on this
            # connection, and must never be read as the next request's (it was: a paused
            # subscription's late 200 recorded as another subscription's delivery).
            self.reader = None
            self.close()
            raise
        finally:
            timer.cancel()
            self.waiter = None

    def _expire(self) -> None:
        self._fail(TimeoutError())
        self.close()  # the answer may still come; this connection cannot carry another request

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class _IdleConnections:
    """The idle connections of all of a sender's pools, oldest first, and how many it keeps
    (MAX_IDLE). Beyond the bound the connection idle longest, on whichever endpoint, is closed,
    not the one just given back: closing that one made every request of a busy endpoint open a
    new connection once quiet endpoints had filled the bound (`bench fanout --stall 2`: 66,231
    connections for 100,000 requests, and answers 20 s late)."""

    __slots__ = ("limit", "oldest_first")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.oldest_first: OrderedDict[_Connection, _Pool] = OrderedDict()

    def add(self, pool: _Pool, conn: _Connection) -> None:
        pool.idle.append(conn)
        self.oldest_first[conn] = pool
        while len(self.oldest_first) > self.limit:
            old, its_pool = self.oldest_first.popitem(last=False)
            its_pool.idle.remove(old)
            old.close()

    def taken(self, conn: _Connection) -> None:
        """``conn`` left its pool's idle stack (reused or closed)."""
        del self.oldest_first[conn]


class _Pool:
    """Kept-alive connections to one endpoint; at most ``size`` open, one request each."""

    def __init__(self, scheme: str, host: str, port: int, size: int, policy: AddressPolicy,
                 tls: ssl.SSLContext | None, idle_set: _IdleConnections) -> None:  # fmt: skip
        self.host, self.port = host, port
        self.policy = policy
        self.ssl = tls if scheme == "https" else None
        #: most recently given back last; kept in step with idle_set
        self.idle: list[_Connection] = []
        self.idle_set = idle_set
        self.slots = Slots(size)
        #: loop time until which connections are closed after each answer (UNTRUSTED_FOR)
        self.untrusted_until = 0.0

    def sent_unasked(self, data: bytes) -> None:
        """A connection of this endpoint got bytes while no request was waiting (module docstring)."""
        now = asyncio.get_running_loop().time()
        if now >= self.untrusted_until:
            log.warning(
                "%s:%s sent %d byte(s) no request asked for (%r) on a kept-alive connection: a late or second "
                "answer, which HTTP/1.1 cannot tell from the next request's; its connections are not reused for "
                "%d s. Check that the receiver answers each request once",
                self.host, self.port, len(data), data[:60], UNTRUSTED_FOR,
            )  # fmt: skip
        self.untrusted_until = now + UNTRUSTED_FOR

    def take_idle(self) -> _Connection | None:
        """The most recently used idle connection that is still open and not about to be closed
        by the server (a request written as it closes is lost and must be sent again)."""
        now = asyncio.get_running_loop().time()
        while self.idle:
            conn = self.idle.pop()
            self.idle_set.taken(conn)
            if not conn.closed and now < conn.idle_until:
                return conn
            conn.close()
        return None

    async def connect(self, timings: _Clock) -> _Connection:
        """Resolve, refuse forbidden addresses, then connect to one allowed address itself."""
        loop = asyncio.get_running_loop()
        last_error: OSError | None = None
        timings.connecting()
        addresses = await allowed_addresses(self.host, self.port, self.policy)
        timings.resolved()
        for _, ip in addresses:
            try:
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    ip,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
                timings.connected()
                return conn
            except OSError as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    def give_back(self, conn: _Connection) -> None:
        if conn.reusable and not conn.closed and asyncio.get_running_loop().time() >= self.untrusted_until:
            # Reused only well inside the server's idle timeout, when it said one (Node and
            # uvicorn: 5 s, gunicorn: 2 s), else for IDLE_LIMIT seconds.
            announced = conn.idle_timeout
            limit = IDLE_LIMIT if announced is None else announced - min(IDLE_MARGIN, announced / 2)
            now = asyncio.get_running_loop().time()
            # The most recent is reused first, so those a burst opened lie under it, unused: closed
            # once past their time, not kept while the endpoint stays busy (with a server that keeps
            # idle connections open, 1,000 endpoints held every connection their bursts ever opened).
            while self.idle and (self.idle[0].idle_until <= now or self.idle[0].closed):
                stale = self.idle.pop(0)
                self.idle_set.taken(stale)
                stale.close()
            conn.idle_until = now + limit
            self.idle_set.add(self, conn)
            return
        conn.close()

    def close(self) -> None:
        for conn in self.idle:
            self.idle_set.taken(conn)
            conn.close()
        self.idle.clear()


class _Clock:
    """When each phase of one exchange ended (curl's phases, for pg_net's timeout message)."""

    __slots__ = ("connect_at", "connecting_at", "dns_at", "earlier", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.connecting_at: float | None = None  # None: a kept-alive connection was reused
        self.dns_at: float | None = None
        self.connect_at: float | None = None
        #: tries that reached the wire before the last one (a kept-alive connection the server closed)
        self.earlier: list[HttpResult] | None = None

    def tries(self) -> tuple[HttpResult, ...]:
        return tuple(self.earlier) if self.earlier else ()

    def connecting(self) -> None:
        self.connecting_at, self.dns_at, self.connect_at = time.perf_counter(), None, None

    def resolved(self) -> None:
        self.dns_at = time.perf_counter()

    def connected(self) -> None:
        self.connect_at = time.perf_counter()

    def timings(self) -> Timings:
        """The phases so far; a phase cut short by a timeout ends now."""
        now = time.perf_counter()
        if self.connecting_at is None:
            return Timings((now - self.started) * 1000, 0.0, 0.0, (now - self.started) * 1000)
        dns_end = self.dns_at or now
        connect_end = self.connect_at or (now if self.dns_at else dns_end)
        return Timings(
            total_ms=(now - self.started) * 1000,
            dns_ms=(dns_end - self.started) * 1000,  # from the start, as curl counts: the phases add up
            connect_ms=(connect_end - dns_end) * 1000,
            exchange_ms=(now - connect_end) * 1000 if self.connect_at else 0.0,
        )


#: Header names checked before, lowercased (the same few come with every request) ...
_NAMES: dict[str, str] = {}
#: ... and those of them that are neither framing headers nor User-Agent.
_PLAIN_NAMES: set[str] = set()
#: Request headers that only the client writes: they frame the request.
_OWN = frozenset(("host", "content-length", "transfer-encoding"))


@lru_cache(maxsize=4096)
def _target(method: str, url: str) -> tuple[tuple[str, str, int], str]:
    """The endpoint and the request line up to the Host header's value, for ``method url``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in url for c in "\r\n\t\0 "):  # urlsplit silently drops some of these
        raise ValueError("URL contains whitespace or control characters")
    path.encode("ascii", "strict")
    endpoint = endpoint_of(url)
    default_port = 443 if endpoint[0] == "https" else 80
    # an IPv6 literal keeps its brackets (RFC 9110 7.2): nginx answered 400 to "Host: ::1:8080"
    name = f"[{endpoint[1]}]" if ":" in endpoint[1] else endpoint[1].encode("idna").decode("ascii")
    host = name if endpoint[2] == default_port else f"{name}:{endpoint[2]}"
    return endpoint, f"{method} {path} HTTP/1.1\r\nHost: {host}"


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The system's trusted CAs (or those of SSL_CERT_FILE / SSL_CERT_DIR), plus ``ca_file``'s."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def tls_reason(exc: ssl.SSLError) -> str:
    """What the TLS layer said, as precisely as it said it (CERTIFICATE_VERIFY_FAILED alone
    does not tell an untrusted CA from a wrong name or an expired certificate)."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    reason = str(exc.reason or exc)
    if "CERTIFICATE_REQUIRED" in reason:
        return f"{reason}: the server requires a client certificate, which pgferry does not present"
    if reason == "WRONG_VERSION_NUMBER":  # the answer was not TLS (outside probe)
        return f"{reason}: the server does not speak TLS on this port (is it an http:// endpoint?)"
    if reason == "SSLV3_ALERT_HANDSHAKE_FAILURE":
        return (f"{reason}: no protocol or cipher in common, or the server requires a client certificate, "
                "which pgferry does not present")  # fmt: skip
    return reason


class FastSender:
    """Requests over per-endpoint pools of kept-alive connections (webhooks and the pg_net API)."""

    def __init__(
        self,
        *,
        pool_size: int = 64,
        policy: AddressPolicy = DEFAULT_POLICY,
        tls: ssl.SSLContext | None = None,
        max_idle: int = MAX_IDLE,
    ) -> None:
        self.pool_size = pool_size
        self.policy = policy
        self.tls = tls
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._idle = _IdleConnections(max_idle)

    def _pool(self, endpoint: tuple[str, str, int]) -> _Pool:
        pool = self._pools.get(endpoint)
        if pool is None:
            tls = self.tls
            if endpoint[0] == "https" and tls is None:
                tls = self.tls = tls_context()
            pool = self._pools[endpoint] = _Pool(*endpoint, self.pool_size, self.policy, tls, self._idle)
        return pool

    async def send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        on_wire: Callable[[], bool] | None = None,
        fresh: bool = False,
    ) -> HttpResult:
        """A webhook POST. ``on_wire`` is asked right before the first byte is written; if it
        answers False nothing is sent and the result's error class is ``withdrawn``. ``fresh``:
        on a new connection, not a kept-alive one (a probe of an endpoint that was down). A
        header value holding a control character but HTAB is not sent (``bad_request``)."""
        started = time.perf_counter()
        result, _, _ = await self._one("POST", url, body, headers, timeout, connect_timeout, False, on_wire, None,
                                       started, fresh, strict=True)  # fmt: skip
        return result

    def drop_idle(self, endpoint: tuple[str, str, int]) -> None:
        """Close the endpoint's idle kept-alive connections (it just went down: they are suspect)."""
        pool = self._pools.get(endpoint)
        if pool is not None:
            pool.close()

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        capture: bool = False,
        redirects: int = 0,
        on_wire: Callable[[], bool] | None = None,
    ) -> HttpResult:
        """Any request. ``capture``: keep every response header and up to MAX_CAPTURED_BYTES of
        the body (``HttpResult.captured``). ``redirects``: how many to follow (0: a 3xx is
        the answer). The timeout covers the whole request, redirects included. Header values
        are sent as libcurl sends them (the pg_net API): only CR, LF and NUL are refused."""
        started = time.perf_counter()
        earlier: tuple[HttpResult, ...] = ()
        deadline: float | None = None
        for hop in range(redirects + 1):
            result, response, deadline = await self._one(method, url, body, headers, timeout, connect_timeout,
                                                         capture, on_wire, deadline, started)  # fmt: skip
            on_wire = None  # a redirect's request is part of one that reached the wire
            earlier += result.earlier
            if response is None or not response.location or response.status not in _FOLLOWED:
                break
            if hop == redirects:
                if redirects:
                    result = HttpResult(None, "redirect", f"more than {redirects} redirects, last to "
                                        f"{response.location}", None, 0.0, timings=result.timings,
                                        curl_error="Number of redirects hit maximum amount")  # fmt: skip
                break
            method, url, body, headers = _redirected(method, url, body, headers, response)
        if hop or earlier != result.earlier:
            latency = (time.perf_counter() - started) * 1000
            result = HttpResult(result.status, result.error_class, result.error, result.response, latency,
                                result.retry_after, result.captured, earlier, result.timings,
                                result.curl_error)  # fmt: skip
        return result

    async def _one(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        connect_timeout: float,
        capture: bool,
        on_wire: Callable[[], bool] | None,
        deadline: float | None,
        started: float,
        fresh: bool = False,
        *,
        strict: bool = False,
    ) -> tuple[HttpResult, Response | None, float | None]:
        """One request-response exchange: its result, the answer if there was one (for
        redirects) and the deadline it ran under. ``started``: when the request began.
        ``strict``: header values by RFC 9110 (``_checked_head``)."""
        try:
            endpoint, line = _target(method, url)
            data = _serialize(line, method, body, headers, strict)
        except (ValueError, UnicodeError) as exc:
            error = f"cannot send to {url!r}: {exc}"
            return HttpResult(None, "bad_request", error, None, (time.perf_counter() - started) * 1000), None, deadline
        except _BadHeader as exc:
            latency = (time.perf_counter() - started) * 1000
            return HttpResult(None, "bad_request", str(exc), None, latency), None, deadline
        pool = self._pools.get(endpoint) or self._pool(endpoint)
        async with pool.slots:
            clock = _Clock(time.perf_counter())
            if deadline is None:  # the wait for a slot does not count
                deadline = asyncio.get_running_loop().time() + timeout
            reader = ResponseReader(MAX_CAPTURED_BYTES if capture else RESPONSE_SNIPPET_BYTES, capture)
            keep = not _asks_close(headers)
            try:
                response = await self._exchange(
                    pool, data, connect_timeout, deadline, clock, on_wire, reader, fresh, keep=keep
                )
            except (_Withdrawn, TimeoutError, _ConnectTimeout, RefusedAddress, _Lost, ProtocolError, OSError) as exc:
                error_class, error, curl = _failure(exc, endpoint, timeout)
                latency = (time.perf_counter() - started) * 1000
                return HttpResult(None, error_class, error, None, latency, None, None, clock.tries(),
                                  clock.timings(), curl), None, deadline  # fmt: skip
        latency = (time.perf_counter() - started) * 1000
        status = response.status
        captured = None
        if capture:
            text = decode_text(bytes(response.body), response.content_type)
            captured = Captured(dict(response.headers), response.content_type, text or None)
        if 200 <= status < 300:
            return HttpResult(status, None, None, None, latency, None, captured, clock.tries()), response, deadline
        snippet = decode_text(bytes(response.body[:RESPONSE_SNIPPET_BYTES]), response.content_type)
        if 300 <= status < 400 and response.location:
            error_class, error = "redirect", f"HTTP {status} redirect to {response.location} (not followed)"
            retry_after = None
        else:
            error_class, error = "http_status", f"HTTP {status} {response.reason}".strip()
            retry_after = parse_retry_after(response.retry_after)
        return HttpResult(status, error_class, error, snippet, latency, retry_after, captured, clock.tries(),
                          clock.timings()), response, deadline  # fmt: skip

    async def _exchange(
        self,
        pool: _Pool,
        data: bytes,
        connect_timeout: float,
        deadline: float,
        clock: _Clock,
        on_wire: Callable[[], bool] | None,
        reader: ResponseReader,
        fresh: bool = False,
        *,
        keep: bool = True,
    ) -> Response:
        """``keep``: the connection may carry another request after this one (False: the request
        said ``Connection: close``, RFC 9112 9.6)."""
        conn = None if fresh else pool.take_idle()
        fresh = conn is None
        if conn is None:
            conn = await _connect(pool, connect_timeout, deadline, clock)
        if on_wire is not None and not on_wire():
            pool.give_back(conn)
            raise _Withdrawn
        try:
            response = await conn.request(data, deadline, reader)
        except _Lost as exc:
            pool.give_back(conn)
            if fresh or exc.got_bytes:
                raise
            # The server closed a kept-alive connection just as we reused it, without a
            # byte of answer: most likely it never read the request. Send it once more on
            # a new connection, and report the first try (it reached the wire).
            latency = (time.perf_counter() - clock.started) * 1000
            error = "server closed the kept-alive connection without answering; sent again on a new connection"
            clock.earlier = [HttpResult(None, "empty_reply", error, None, latency)]
            conn = await _connect(pool, connect_timeout, deadline, clock)
            reader = reader.again()
            try:
                response = await conn.request(data, deadline, reader)
            except BaseException:
                pool.give_back(conn)
                raise
        except BaseException:
            pool.give_back(conn)
            raise
        if not keep:
            conn.reusable = False
        pool.give_back(conn)
        return response

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


class _BadHeader(Exception):
    pass


def _failure(  # noqa: PLR0911 - one return per way a request can end
    exc: BaseException, endpoint: tuple[str, str, int], timeout: float
) -> tuple[str, str, str | None]:
    """(error class, error text, libcurl's text) of a request that ended without an answer.
    libcurl's text (curl_easy_strerror) is what the pg_net API records as error_msg; None
    where pg_net words it itself (timeouts) or has no such failure."""
    host = host_port(endpoint[1], endpoint[2])
    if isinstance(exc, _Withdrawn):
        return "withdrawn", "taken back before it was sent", None
    if isinstance(exc, _ConnectTimeout):
        handshake = " (TCP connection and TLS handshake: is it an https server?)" if exc.tls else ""
        return "timeout", f"cannot connect to {host} within {exc.seconds:.3g} s{handshake}", None
    if isinstance(exc, TimeoutError):
        return "timeout", f"no complete answer within {timeout:g} s", None
    if isinstance(exc, socket.gaierror):
        return "dns", f"cannot resolve host {endpoint[1]!r}: {exc}", "Couldn't resolve host name"
    if isinstance(exc, RefusedAddress):
        return "refused_address", str(exc), None
    if isinstance(exc, ssl.SSLError):
        verify = isinstance(exc, ssl.SSLCertVerificationError)
        curl = "SSL peer certificate or SSH remote key was not OK" if verify else "SSL connect error"
        return "tls", f"TLS error with {host}: {tls_reason(exc)}", curl
    if isinstance(exc, _Lost):
        curl = RECV_ERROR if exc.reset else PARTIAL if exc.got_status else NOTHING
        if exc.got_bytes:
            return "reset", f"response cut off: {exc}", curl
        # A TLS 1.3 server that wants a client certificate checks it after the handshake, and
        # Python's (uvicorn, aiohttp) then breaks the connection without an alert (outside probe).
        hint = "; a TLS 1.3 server that requires a client certificate (pgferry presents none) does this"
        hint = hint if endpoint[0] == "https" else ""
        if exc.reset:  # the reset's own words (ECONNRESET) said more than "closed" (outside probe)
            return "empty_reply", f"server broke the connection without a response ({exc}){hint}", curl
        return "empty_reply", f"server closed the connection without a complete response{hint}", curl
    if isinstance(exc, ProtocolError):
        return "invalid_response", str(exc), exc.curl
    assert isinstance(exc, OSError)
    if endpoint[0] == "https" and isinstance(exc, (ConnectionResetError, ConnectionAbortedError)):
        # connected, then cut off in the TLS handshake: the server may want a client certificate
        # (pgferry presents none) or not speak TLS; a bare reset said nothing (outside probe)
        reason = (
            f"the server broke off the TLS handshake ({exc.strerror or type(exc).__name__}): it may require "
            "a client certificate, which pgferry does not present, or not speak TLS on this port"
        )
        return "tls", f"TLS error with {host}: {reason}", "SSL connect error"
    return (
        "connect",
        f"cannot connect to {host}: {exc.strerror or exc or type(exc).__name__}",
        "Couldn't connect to server",
    )


def _asks_close(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` say ``Connection: close``: a subscription's way to get a new connection
    for every request (for a receiver that may answer a request twice: a second answer arriving
    after the next request was written would be taken for its answer, docs/reliability.md)."""
    for name, value in headers.items():
        if len(name) == 10 and name.lower() == "connection":
            return any(token.strip().lower() == "close" for token in value.split(","))
    return False


def _serialize(line: str, method: str, body: bytes | None, headers: Mapping[str, str], strict: bool = True) -> bytes:
    """The request's bytes after its request line and Host header (``line``). The last line of
    defence against header injection: whatever the SQL checks let through, no CR/LF/NUL and no
    invalid header name reaches the wire, and with ``strict`` no other control character but
    HTAB either (RFC 9110: strict servers answer 400 to them)."""
    length = f"\r\nContent-Length: {len(body) if body else 0}" if body is not None or method not in _BODYLESS else ""
    if headers and _PLAIN_NAMES.issuperset(headers) and "".join(headers.values()).isprintable():
        # the usual request: names checked before, none of them ours or User-Agent, printable
        # values (no control character at all): C-level checks and joins
        text = line + "\r\n" + "\r\n".join(map(": ".join, headers.items())) + _USER_AGENT + length + "\r\n\r\n"
    else:
        text = _checked_head(line, headers, strict) + length + "\r\n\r\n"
    head = text.encode("utf-8")
    return head + body if body else head


def _checked_head(line: str, headers: Mapping[str, str], strict: bool) -> str:
    """``_serialize``'s head, header by header: checks each name (remembering the plain ones)
    and value, leaves out the framing headers that are ours to write."""
    parts = [line]
    user_agent = False
    for name, value in headers.items():
        lowered = _NAMES.get(name)
        if lowered is None:
            if not _TOKEN.match(name):
                raise _BadHeader(f"header name {name[:100]!r} is not a valid HTTP header name")
            lowered = name.lower()
            if len(_NAMES) < 4096:
                _NAMES[name] = lowered
                if lowered not in _OWN and lowered != "user-agent":
                    _PLAIN_NAMES.add(name)
        fault = header_value_fault(value, strict=strict)
        if fault is not None:
            raise _BadHeader(f"header {name!r} contains {fault}, which HTTP does not allow in a header value; not sent")
        if lowered in _OWN:
            continue  # framing is ours to state
        user_agent = user_agent or lowered == "user-agent"
        parts.append(f"{name}: {value}")
    return "\r\n".join(parts) + ("" if user_agent else _USER_AGENT)


def _redirected(
    method: str, url: str, body: bytes | None, headers: Mapping[str, str], response: Response
) -> tuple[str, str, bytes | None, Mapping[str, str]]:
    """The request a redirect asks for: a 301/302/303 turns a POST into a GET without body."""
    assert response.location is not None
    target = urljoin(url, response.location)
    if response.status in _SEE_OTHER and method not in ("GET", "HEAD"):
        return "GET", target, None, {k: v for k, v in headers.items() if k.lower() != "content-type"}
    return method, target, body, headers


async def _connect(pool: _Pool, connect_timeout: float, deadline: float, clock: _Clock) -> _Connection:
    """A new connection within ``connect_timeout`` (_ConnectTimeout) and before the request's
    ``deadline`` (TimeoutError), whichever comes first."""
    limit = min(connect_timeout, deadline - asyncio.get_running_loop().time())
    try:
        async with asyncio.timeout(limit):
            return await pool.connect(clock)
    except TimeoutError:
        # said as a connect timeout either way: an https URL on a plain-HTTP server waits here, in
        # the TLS handshake, and "no complete answer" did not say so (outside probe)
        raise _ConnectTimeout(max(limit, 0.0), pool.ssl is not None) from None
