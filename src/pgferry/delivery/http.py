"""What a request ends as, and small pieces of HTTP shared by the client and its callers.

``HttpResult`` is what every request ends as, good or bad: a short error
class and a human-readable error text; nothing in delivery raises for a
failed request. The client that produces them is ``delivery.fasthttp``.
"""

from __future__ import annotations

import email.utils
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

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
class Timings:
    """Where a request's time went, in curl's phases (pg_net reports them on timeouts)."""

    total_ms: float
    dns_ms: float
    connect_ms: float  # TCP and TLS handshakes
    exchange_ms: float  # request sent, response read


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int | None
    error_class: str | None  # None: delivered (2xx)
    error: str | None
    response: str | None  # start of the response body, kept for failures
    latency_ms: float
    retry_after: float | None = None
    captured: Captured | None = None
    #: tries that reached the wire before this one (a kept-alive connection the server had
    #: closed): each is an attempt the operator must be able to see
    earlier: tuple[HttpResult, ...] = ()
    #: the phases of a request that did not end in 2xx (pg_net's timeout message); None for 2xx,
    #: where nothing reads them and building them cost ~1.2 us a request
    timings: Timings | None = None
    #: what libcurl calls this failure (curl_easy_strerror), for the pg_net API's error_msg; None
    #: for an answer, a timeout (pg_net words it itself) or a failure of pgferry's own checks
    curl_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None


#: What RFC 9110 does not allow in a header field value: the control characters but HTAB, and DEL.
#: Strict servers answer 400 to any of them (llhttp, so Node and aiohttp: all of them; h11: VT and FF).
BAD_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: What would end or cut a header line: the one rule of the pg_net API, whose libcurl sends the
#: other control characters as they are.
HEADER_BREAK = re.compile(r"[\r\n\0]")


def header_value_fault(value: str, *, strict: bool = True) -> str | None:
    """Why ``value`` cannot go out as a header value ("the control character 0x01"), or None.
    ``strict``: by RFC 9110 (BAD_HEADER_VALUE), else only what would break the line (HEADER_BREAK)."""
    found = (BAD_HEADER_VALUE if strict else HEADER_BREAK).search(value)
    if found is None:
        return None
    byte = ord(found.group())
    if byte in (0x0A, 0x0D):
        return f"a line break (0x{byte:02X})"
    return "NUL (0x00)" if byte == 0 else f"the control character 0x{byte:02X}"


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date); None when it is
    neither. Delta-seconds are ASCII digits only: ``str.isdigit`` also takes "²" (a header is
    read as Latin-1), which then failed ``float`` inside the sender (outside probe)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def decode_text(raw: bytes, content_type: str | None) -> str:
    """A body as text, in the charset its Content-Type names (UTF-8 otherwise)."""
    charset = None
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"') or None
    return _decode(raw, charset)


def _decode(raw: bytes, charset: str | None) -> str:
    try:
        text = raw.decode(charset or "utf-8", "replace")
    except (LookupError, UnicodeError):  # a charset Python does not know, or "undefined", "idna", ...
        text = raw.decode("utf-8", "replace")
    return text.split("\0", 1)[0]  # PostgreSQL text cannot hold NUL; pg_net stops there too


def endpoint_of(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 literal in brackets (logs said ``::1:8080``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
