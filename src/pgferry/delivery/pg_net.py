"""The pg_net-compatible side of delivery: requests queued by net.http_get/post/delete.

Each event of stream 'net.http' describes one request (method, url, headers,
body, timeout). Unlike a webhook, any HTTP answer except 429 and 5xx is the
final result, as in pg_net; those and transport errors are retried with the
'pg_net' subscription's schedule. The final outcome becomes a row of
net._http_response with pg_net's columns and, for errors, the very texts
pg_net stores (libcurl's ``curl_easy_strerror``, and pg_net's own timeout
message with its phase timings), so existing checks such as
``error_msg like 'Timeout of % ms reached%'`` or
``error_msg = 'Couldn''t connect to server'`` keep matching; the detail
behind each (which address, which TLS check) is in ferry.attempts.

The requests go through the same client as webhooks (``delivery.fasthttp``),
asked to keep the whole answer and to follow redirects as pg_net's libcurl
does (up to 30).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from pgferry import sql
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.sink import Prepared, Sink

#: libcurl's default since 8.3 (pg_net sets CURLOPT_FOLLOWLOCATION and no CURLOPT_MAXREDIRS).
MAX_REDIRECTS = 30

#: Failures of pgferry's own checks (pg_net has no body limit and no address policy).
OWN_TEXT = {"too_large": "Request body too large", "bad_request": "Request could not be sent"}
#: pg_net's timeout message (src/errors.c), with libcurl's phases.
TIMEOUT_TEXT = (
    "Timeout of {timeout} ms reached. Total time: {total:f} ms (DNS time: {dns:f} ms, "
    "TCP/SSL handshake time: {handshake:f} ms, HTTP Request/Response time: {exchange:f} ms)"
)


def is_final(result: HttpResult) -> bool:
    """An answer pg_net users see as the response: anything but 429 and 5xx."""
    return result.status is not None and result.status != 429 and result.status < 500


async def send(sender: FastSender, sub: Subscription, event: OutEvent, *, max_body_bytes: int = 1 << 20) -> HttpResult:
    try:
        request: dict[str, Any] = orjson.loads(event.payload)
        headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items() if v is not None}
        body = request.get("body")
        if not isinstance(request["url"], str) or not isinstance(request["method"], str):
            raise TypeError("url and method must be strings")
        if body is not None and not isinstance(body, str):
            raise TypeError("body must be JSON text")
        timeout_ms = float(request["timeout_ms"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # Only net.http_* should write to stream 'net.http'; anything else is not a request.
        return HttpResult(None, "bad_request", f"event {event.id} in stream 'net.http' is not a request: {exc!r}",
                          None, 0.0)  # fmt: skip
    url: str = request["url"]
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        error = f"URL {url[:200]!r} contains whitespace or control characters"
        return HttpResult(None, "bad_request", error, None, 0.0)
    size = len(body.encode()) if body is not None else 0
    if size > max_body_bytes:
        error = f"request body is {size} bytes, over the {max_body_bytes}-byte limit (ferry.config.max_body_bytes)"
        return HttpResult(None, "too_large", error, None, 0.0)
    return await sender.request(
        request["method"],
        url,
        body.encode() if body is not None else None,
        headers,
        timeout=timeout_ms / 1000,
        connect_timeout=min(sub.connect_timeout_ms, timeout_ms) / 1000,
        capture=True,
        redirects=MAX_REDIRECTS,
    )


def response_row(event: OutEvent, result: HttpResult) -> tuple[Any, ...]:
    """(id, status_code, content_type, headers, content, timed_out, error_msg) for net._http_response."""
    if result.status is not None and result.captured is not None:
        captured = result.captured
        return (event.id, result.status, captured.content_type, orjson.dumps(captured.headers).decode(),
                captured.content or None, False, None)  # fmt: skip
    if result.error_class == "timeout":
        return (event.id, None, None, None, None, True, timeout_text(event, result))
    if result.curl_error is not None:  # what libcurl says of the same failure (delivery.fasthttp)
        message = result.curl_error
    elif result.error_class in OWN_TEXT:  # failures pg_net does not have: ours, with the detail
        message = f"{OWN_TEXT[result.error_class]}: {result.error}"
    else:
        message = result.error or "request failed"
    return (event.id, None, None, None, None, False, message)


def timeout_text(event: OutEvent, result: HttpResult) -> str:
    """pg_net's timeout message: 'Timeout of N ms reached. Total time: ... (DNS time: ..., ...)'."""
    timeout_ms = orjson.loads(event.payload)["timeout_ms"]
    t = result.timings
    if t is None:
        return TIMEOUT_TEXT.format(timeout=timeout_ms, total=result.latency_ms, dns=0.0, handshake=0.0, exchange=0.0)
    return TIMEOUT_TEXT.format(timeout=timeout_ms, total=t.total_ms, dns=t.dns_ms, handshake=t.connect_ms,
                               exchange=t.exchange_ms)  # fmt: skip


class PgNetSink(Sink):
    """Each event is a request of its own, with its own URL and timeout: no endpoint health, no
    letting go (pg_net's timeouts are the requests' own), and any answer but 429 and 5xx is final."""

    @property
    def batch_size(self) -> int:
        return 1

    def may_let_go(self, detach_after: float) -> bool:
        return False

    async def ready(self, events: Sequence[OutEvent]) -> Sequence[OutEvent]:
        """The requests not cancelled (deleted from net.http_request_queue) meanwhile."""
        if not events:
            return events
        async with self.ctx.pool.acquire() as conn:
            queued = {r["id"] for r in await conn.fetch(sql.query("net_requests_queued"), [e.id for e in events])}
        return [e for e in events if e.id in queued]

    async def send(
        self, chunk: Sequence[OutEvent], prepared: Prepared, on_wire: Callable[[], bool] | None, *, fresh: bool
    ) -> HttpResult:
        return await send(self.ctx.http, self.sub, chunk[0], max_body_bytes=self.ctx.max_body_bytes)

    def delivered(self, result: HttpResult) -> bool:
        return is_final(result)

    def response_row(self, event: OutEvent, result: HttpResult) -> tuple[Any, ...] | None:
        return response_row(event, result)
