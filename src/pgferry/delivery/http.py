"""HTTP results shared by both senders, and the general-purpose sender (aiohttp).

``HttpResult`` is what every request ends as, good or bad: a short error
class and a human-readable error text; nothing here raises for a failed
delivery. ``HttpSender`` serves the pg_net API's requests, which need what
webhooks do not (any method, redirects followed, the whole response kept);
webhook POSTs take the leaner path in ``delivery.fasthttp``. Both keep one
bounded keep-alive pool per endpoint (scheme, host, port): this is what keeps
a busy relay from leaving thousands of sockets in TIME_WAIT the way
one-connection-per-request senders do.
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import ResolveResult
from yarl import URL

from pgferry.delivery.addresses import DEFAULT_POLICY, AddressPolicy, RefusedAddress

RESPONSE_SNIPPET_BYTES = 2048
#: the most of a response body kept (pg_net's net._http_response.content)
MAX_CAPTURED_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Captured:
    """The whole response, for callers that store it (the pg_net API)."""

    headers: dict[str, str]
    content_type: str | None
    content: str | None


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int | None
    error_class: str | None  # None: delivered (2xx)
    error: str | None
    response: str | None  # start of the response body, kept for failures
    latency_ms: float
    retry_after: float | None = None
    captured: Captured | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


@lru_cache(maxsize=4096)
def _as_sent(url: str) -> URL:
    """Send an ASCII URL byte for byte: pg_net users' query strings are already percent-encoded.
    Cached: parsing a URL costs more than a pooled request's own bookkeeping."""
    return URL(url, encoded=True) if url.isascii() else URL(url)


@lru_cache(maxsize=256)
def _timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


async def _read_up_to(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or its first ``limit`` bytes (read(n) alone returns only what is buffered)."""
    chunks = bytearray()
    while len(chunks) < limit:
        chunk = await resp.content.read(limit - len(chunks))
        if not chunk:
            break
        chunks += chunk
    return bytes(chunks)


def _decode(raw: bytes, charset: str | None) -> str:
    try:
        text = raw.decode(charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        text = raw.decode("utf-8", "replace")
    return text.split("\0", 1)[0]  # PostgreSQL text cannot hold NUL; pg_net stops there too


class _GuardedSockets:
    """aiohttp's socket factory: the last point before connecting, so it sees the very
    address used, whether it came from DNS, an IP literal or a redirect."""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy

    def __call__(self, addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        reason = self.policy.refusal(str(sockaddr[0]))
        if reason is not None:
            raise RefusedAddress(f"refused to connect to {sockaddr[0]}: {reason}")
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


class _PolicyResolver(aiohttp.ThreadedResolver):
    """Drops refused addresses from DNS answers, so a name with one good and one refused
    address uses the good one, and a name with only refused ones fails with the reason
    (the socket factory above still checks the address finally connected to)."""

    def __init__(self, policy: AddressPolicy) -> None:
        super().__init__()
        self.policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await super().resolve(host, port, family)
        allowed = [r for r in results if self.policy.refusal(str(r["host"])) is None]
        if not allowed:
            reason = self.policy.refusal(str(results[0]["host"])) if results else "no address"
            raise RefusedAddress(f"refused to connect to {host}: {reason}")
        return allowed


def endpoint_of(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port


class HttpSender:
    """Sends any request, follows redirects and keeps the whole answer (the pg_net API's needs)."""

    def __init__(self, *, pool_size: int = 64, policy: AddressPolicy = DEFAULT_POLICY) -> None:
        self.pool_size = pool_size
        self.policy = policy
        self._sessions: dict[tuple[str, str, int], aiohttp.ClientSession] = {}

    def _session(self, url: str) -> aiohttp.ClientSession:
        key = endpoint_of(url)
        session = self._sessions.get(key)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                socket_factory=_GuardedSockets(self.policy),
                resolver=_PolicyResolver(self.policy),
                limit=self.pool_size,
                limit_per_host=self.pool_size,
                ttl_dns_cache=60,
                keepalive_timeout=30,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                headers={"User-Agent": "pgferry"},
            )
            self._sessions[key] = session
        return session

    async def send(  # noqa: PLR0911 - one return per way a request can end
        self,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        method: str = "POST",
    ) -> HttpResult:
        started = time.perf_counter()
        captured: Captured | None = None

        def done(status: int | None, error_class: str | None, error: str | None, response: str | None = None,
                 retry_after: float | None = None) -> HttpResult:  # fmt: skip
            latency = (time.perf_counter() - started) * 1000
            return HttpResult(status, error_class, error, response, latency, retry_after, captured)

        try:
            session = self._session(url)
            async with session.request(
                method,
                _as_sent(url),
                data=body,
                headers=headers,
                allow_redirects=True,
                max_redirects=10,
                timeout=_timeout(timeout, connect_timeout),
            ) as resp:
                raw = await _read_up_to(resp, MAX_CAPTURED_BYTES)
                text = _decode(raw, resp.charset) if raw else None
                headers = {str(k): v for k, v in resp.headers.items()}
                captured = Captured(headers, resp.headers.get("Content-Type"), text)
                if 200 <= resp.status < 300:
                    return done(resp.status, None, None)
                snippet = text[:RESPONSE_SNIPPET_BYTES] if text else ""
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                if 300 <= resp.status < 400:
                    where = resp.headers.get("Location", "?")
                    return done(resp.status, "redirect", f"HTTP {resp.status} redirect to {where} (not followed)",
                                snippet)  # fmt: skip
                return done(resp.status, "http_status", f"HTTP {resp.status} {resp.reason or ''}".strip(),
                            snippet, retry_after)  # fmt: skip
        except TimeoutError:
            return done(None, "timeout", f"no complete answer within {timeout:g} s")
        except aiohttp.ClientConnectorDNSError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                return done(None, "refused_address", str(exc.os_error))
            return done(None, "dns", f"cannot resolve host {endpoint_of(url)[1]!r}: {exc.os_error}")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                return done(None, "refused_address", str(exc.os_error))
            return done(
                None, "connect", f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}"
            )
        except aiohttp.TooManyRedirects as exc:
            return done(None, "redirect", f"more than 10 redirects, last to {exc.request_info.real_url}")
        except aiohttp.ServerDisconnectedError:
            return done(None, "empty_reply", "server closed the connection without a complete response")
        except aiohttp.ClientPayloadError as exc:
            return done(None, "reset", f"response body cut off: {exc}")
        except aiohttp.ClientResponseError as exc:
            return done(None, "invalid_response", f"invalid HTTP response: {exc.message}")
        except aiohttp.ClientOSError as exc:
            return done(None, "reset", f"connection error: {exc.strerror or exc}")
        except aiohttp.InvalidURL as exc:  # e.g. a legacy numeric IPv4 form such as 2130706433
            return done(None, "bad_request", f"invalid URL: {exc}")
        except aiohttp.ClientError as exc:
            return done(None, "client_error", f"{type(exc).__name__}: {exc}")
        except (ValueError, asyncio.InvalidStateError) as exc:
            return done(None, "bad_request", f"request could not be sent: {exc}")

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
