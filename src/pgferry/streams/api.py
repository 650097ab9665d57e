"""The streams HTTP API the relay serves (`pgferry run --api-port PORT`).

- ``GET /v1/streams/{name}``: Server-Sent Events. ``id:`` is the event's
  offset; a client resumes with ``Last-Event-ID`` (what ``EventSource`` sends
  when it reconnects) or ``?after=``; a comment every ``heartbeat`` seconds
  keeps proxies from closing an idle stream; at the stream's end an ``end``
  event, then the response ends; a reconnect after the end gets 204, which
  tells ``EventSource`` to stop.
- ``GET /v1/streams/{name}/events?after=&limit=&wait=``: the same as JSON,
  for clients without SSE (long-poll: waits up to ``wait`` seconds when there
  is nothing yet).
- ``POST /v1/streams/{name}``: publish one event (``{"payload": ..., "key":
  ..., "headers": ...}``) or a JSON array of them, in one transaction;
  ``POST /v1/streams/{name}/close`` ends the stream.

Every request needs a bearer token whose patterns allow the stream
(``Authorization: Bearer pft_...``, or ``?access_token=`` for EventSource,
which cannot send headers), unless the relay allows anonymous requests from
loopback (``--api-allow-loopback``): 401 without a valid token, 403 with one
that does not cover the stream. Browsers get CORS headers for the origins
``--api-cors-origin`` lists.

Events are JSON objects ``{"offset", "id", "stream", "key", "payload",
"headers", "created_at"}``. Live events come from the relay's ``StreamHub``
(one log read per tick for all clients); history from ranges of the log.
A client that stops reading is let go once ``client_buffer`` events wait
for it, with the reason in an ``error`` event: it loses nothing (it resumes
from its last offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol
from urllib.parse import unquote

import asyncpg
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from pgferry import db, sql
from pgferry.api_tokens import Decision, TokenStore, bearer_from_header
from pgferry.errors import PgferryError, TokenStoreUnavailable
from pgferry.relay.surface import is_loopback
from pgferry.streams.hub import Follower, StreamHub
from pgferry.streams.offsets import BadOffset, Offset
from pgferry.streams.reader import (
    OffsetAhead,
    OffsetExpired,
    Position,
    StreamEvent,
    is_end,
    range_end,
    read_range,
    read_range_to,
    read_tick_in_pages,
    start,
)
from pgferry.streams.settings import ApiSettings

log = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_LIMIT = 1000
MAX_WAIT = 30.0
#: The most events one POST may publish, and the largest body.
MAX_PUBLISH = 1000
MAX_BODY = 1 << 20
#: Bytes of history a catching-up SSE client's range aims at. Ranges were 10,000 log events
#: whatever their size: ~170 MB of relay memory per client catching up on 50 KB events (outside
#: probe). A client's ranges start at FIRST_SPAN events and halve or double to stay near this.
HISTORY_BYTES = 4 << 20
FIRST_SPAN = 200
#: Events per page of a one-tick range read through a cursor.
HISTORY_PAGE = 100
#: What one write to a reader carries at most: the stall timeout is per piece, so it measures a
#: client that stopped reading, not the time a slow one takes over a range of history.
WRITE_PIECE = 64 * 1024
#: The kernel send buffer of an SSE connection (the kernel doubles it).
SSE_SEND_BUFFER = 128 * 1024


class Authorizer(Protocol):
    """Who may read or write which stream (``api_tokens.TokenStore``; tests give their own)."""

    async def authorize(self, bearer: str | None, stream: str, action: Literal["read", "write"]) -> Decision: ...


@dataclass
class ApiStats:
    clients: int = 0
    let_go: dict[str, int] = field(default_factory=dict)


def _event_json(event: StreamEvent, offset: str | None = None) -> dict[str, Any]:
    # created_at stays a datetime: orjson writes it exactly as isoformat() does, in a fraction of the time
    return {
        "offset": offset or str(event.offset), "id": event.id, "stream": event.stream, "key": event.key,
        "payload": event.payload, "headers": event.headers, "created_at": event.created_at,
    }  # fmt: skip


def _json(value: Any) -> bytes:
    """``value`` as JSON. orjson refuses more than 254 levels of nesting, which PostgreSQL's
    jsonb allows: one such event could be neither served nor published (its stream's readers
    reconnected forever, outside probe), so those few go through the standard library."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=_isoformat, ensure_ascii=False, separators=(",", ":")).encode()


def _isoformat(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _frame(event: StreamEvent) -> bytes:
    if is_end(event.headers):
        return f"id: {event.offset}\nevent: end\ndata: {{}}\n\n".encode()
    offset = str(event.offset)  # once per event: catch-ups frame a million of them
    return b"".join((b"id: ", offset.encode(), b"\ndata: ", _json(_event_json(event, offset)), b"\n\n"))


class StreamsApi:
    """The aiohttp application, over a pool of its own and the relay's ``StreamHub``."""

    def __init__(
        self, url: str, settings: ApiSettings, authorizer: Authorizer | None = None, hub: StreamHub | None = None
    ) -> None:
        self.url = url
        self.settings = settings
        #: None: the API tokens in the database (``api_tokens.TokenStore``), made on ``open``
        self.authorizer = authorizer
        self.hub = hub if hub is not None else StreamHub(url, range_events=settings.range_events)
        self.pool: asyncpg.Pool | None = None
        self.stats = ApiStats()
        #: the requests that read (SSE, long-polls): ended when the relay stops
        self.readers: set[asyncio.Task[Any]] = set()
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[_database_unreachable])
        self.app.on_response_prepare.append(self._cors)
        self.app.router.add_get("/v1/streams/{name}", self.sse)
        self.app.router.add_get("/v1/streams/{name}/events", self.events)
        self.app.router.add_post("/v1/streams/{name}", self.publish)
        self.app.router.add_post("/v1/streams/{name}/close", self.close)
        self.app.router.add_route("OPTIONS", "/v1/streams/{tail:.*}", self.preflight)

    async def open(self) -> None:
        # stateless: nothing here leaves session state on a connection, so releasing one needs no reset
        # round trip (a connecting client took 7 round trips, 2 of them resets)
        self.pool = await db.create_pool(self.url, min_size=1, max_size=8, reset=db.rollback_if_open,
                                         server_settings={"application_name": "pgferry streams api"})  # fmt: skip
        if self.authorizer is None:
            store = TokenStore(self.pool)
            await store.refresh()  # fail now, not on the first request, if the tokens cannot be read
            self.authorizer = store

    def counts(self) -> dict[str, float]:
        """For the relay's metrics: readers now, streams followed live, and totals since start."""
        hub = self.hub.stats
        return {
            "readers": self.stats.clients, "followed_streams": len(self.hub.followers),
            "hub_reads": hub.ranges_read, "hub_queries": hub.queries, "hub_events": hub.events_read,
            "events_sent_live": hub.frames_handed,
            **{f"let_go_{reason}": n for reason, n in self.stats.let_go.items()},
        }  # fmt: skip

    async def close_pool(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    # -- requests ----------------------------------------------------------

    async def sse(self, request: web.Request) -> web.StreamResponse:
        stream, after = await self._admit(request, "read", sse=True)
        this = self._enter()
        try:
            position = await self._begin(stream, after)
            if position is None:
                return web.Response(status=204)  # EventSource stops reconnecting
            response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
            })  # fmt: skip
            response.force_close()  # a stream's connection is its own; it ends with it
            sock = request.transport.get_extra_info("socket") if request.transport is not None else None
            if sock is not None:
                # A bounded kernel buffer, so that progress shows within stall_timeout: Linux grows
                # a socket's to 4 MB and wakes its writer only once a third of it is free, which
                # took a client reading 49 KiB/s longer than 30 s (cut off mid-history).
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SSE_SEND_BUFFER)
            try:
                await response.prepare(request)
                await self._write(request, response, b"retry: 2000\n\n")
                await self._serve_sse(request, response, stream, position)
            except (ConnectionError, TimeoutError):
                pass  # the client went away, or read nothing for stall_timeout (cut off)
            if request.transport is not None:
                self._close_once_read(request.transport)
            return response
        finally:
            self._leave(this)

    async def events(self, request: web.Request) -> web.Response:
        stream, after = await self._admit(request, "read", sse=False)
        limit = _int(request.query.get("limit"), "limit", 100, 1, MAX_LIMIT)
        wait = _float(request.query.get("wait"), "wait", 0.0, 0.0, MAX_WAIT)
        this = self._enter()
        try:
            position = await self._begin(stream, after)
            if position is None:
                events: list[StreamEvent] = []
                resume: Offset | None = after
            else:
                events, resume = await self._poll(stream, position, limit, wait)
        finally:
            self._leave(this)
        body = {"events": [_event_json(e) for e in events if not is_end(e.headers)],
                "next": resume and str(resume),
                "closed": position is None or (bool(events) and is_end(events[-1].headers))}  # fmt: skip
        return web.Response(body=_json(body), content_type="application/json")

    def _enter(self) -> asyncio.Task[Any]:
        """Count a reader in (503 beyond max_clients); the relay ends it when it stops."""
        if self.stats.clients >= self.settings.max_clients:
            raise _error(503, f"this relay serves {self.settings.max_clients} readers at most; try again shortly",
                         headers={"Retry-After": "1"})  # fmt: skip
        this = asyncio.current_task()
        assert this is not None
        self.stats.clients += 1
        self.readers.add(this)
        return this

    def _leave(self, this: asyncio.Task[Any]) -> None:
        self.stats.clients -= 1
        self.readers.discard(this)

    async def publish(self, request: web.Request) -> web.Response:
        stream, _ = await self._admit(request, "write", sse=False)
        try:
            raw = await request.read()
        except (HttpProcessingError, RequestPayloadError) as exc:  # e.g. a Content-Encoding that does not decode
            raise _error(400, f"the body cannot be read: {' '.join(str(exc).split())}") from None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _error(400, f"the body is not JSON: {exc}") from None
        items = body if isinstance(body, list) else [body]
        if not 1 <= len(items) <= MAX_PUBLISH:
            raise _error(400, f"publish 1 to {MAX_PUBLISH} events per request, not {len(items)}")
        payloads, keys, headers = [], [], []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "payload" not in item or set(item) - {"payload", "key", "headers"}:
                raise _error(400, f'event #{i} must be an object {{"payload": ..., "key": ..., "headers": ...}}')
            key, head = item.get("key"), item.get("headers")
            if key is not None and not isinstance(key, str):
                raise _error(400, f"event #{i}: key must be a string")
            if head is not None and (not isinstance(head, dict) or not all(isinstance(v, str) for v in head.values())):
                raise _error(400, f"event #{i}: headers must be an object of strings")
            payloads.append(_json(item["payload"]).decode())
            keys.append(key)
            headers.append(_json(head).decode() if head is not None else None)
        assert self.pool is not None
        try:
            async with self.pool.acquire() as conn:
                rows = await conn.fetch(sql.query("publish_many"), [stream] * len(items), payloads, keys,
                                        headers if any(h is not None for h in headers) else None)  # fmt: skip
        except asyncpg.PostgresError as exc:
            raise _error(409 if exc.sqlstate == "55000" else 400, str(exc)) from None
        return web.Response(status=201, body=orjson.dumps({"ids": [r[0] for r in rows]}),
                            content_type="application/json")  # fmt: skip

    async def close(self, request: web.Request) -> web.Response:
        stream, _ = await self._admit(request, "write", sse=False)
        assert self.pool is not None
        try:
            async with self.pool.acquire() as conn:
                end = await conn.fetchval(sql.query("close_stream"), stream)
        except asyncpg.PostgresError as exc:
            raise _error(409 if exc.sqlstate == "55000" else 400, str(exc)) from None
        return web.Response(body=orjson.dumps({"end": end}), content_type="application/json")

    async def preflight(self, request: web.Request) -> web.Response:
        return web.Response(status=204)  # the CORS middleware adds what the browser asked for

    # -- admission ---------------------------------------------------------

    async def _admit(
        self, request: web.Request, action: Literal["read", "write"], *, sse: bool
    ) -> tuple[str, Offset | None]:
        stream = request.match_info["name"]
        if not stream or len(stream) > 200 or _CONTROL.search(stream):
            raise _error(400, "a stream name is 1-200 characters without control characters")
        segment = request.raw_path.split("?", 1)[0].removeprefix("/v1/streams/").split("/", 1)[0]
        try:
            unquote(segment, errors="strict")
        except UnicodeDecodeError:  # the router kept such bytes as text: %FF named the stream "%FF"
            raise _error(400, "a stream name is UTF-8, percent-encoded in the path (%FF is not UTF-8)") from None
        if not (self.settings.allow_loopback and is_loopback(request.remote or "")):
            assert self.authorizer is not None
            try:
                decision = await self.authorizer.authorize(_bearer(request), stream, action)
            except TokenStoreUnavailable as exc:
                raise _error(503, f"{exc}; try again shortly") from None
            if decision.status != 200:
                raise _error(decision.status, decision.reason, decision.challenge)
        raw = request.headers.get("Last-Event-ID") if sse else None
        raw = raw or request.query.get("after")
        try:
            return stream, Offset.parse(raw) if raw else None
        except BadOffset as exc:
            raise _error(400, str(exc)) from None

    async def _cors(self, request: web.Request, response: web.StreamResponse) -> None:
        """CORS headers for the listed origins, on every response (errors too, so a page can read
        why), set as it is prepared: an SSE response is prepared before its first event."""
        origin = request.headers.get("Origin")
        origins = self.settings.cors_origins
        if origin is None or not ("*" in origins or origin in origins):
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, Last-Event-ID"
            response.headers["Access-Control-Max-Age"] = "600"

    # -- reading -----------------------------------------------------------

    async def _begin(self, stream: str, after: Offset | None) -> Position | None:
        """Where reading ``stream`` after ``after`` starts; None when there is nothing more to read,
        ever: ``after`` is the stream's end, or it was closed and retention has dropped all of it.
        410 when retention dropped ``after``."""
        assert self.pool is not None
        await self.hub.ready.wait()
        async with self.pool.acquire() as conn:
            try:
                return await start(conn, stream, after)
            except OffsetExpired as exc:
                raise _error(410, str(exc)) from None
            except OffsetAhead as exc:
                raise _error(400, str(exc)) from None

    async def _history(self, stream: str, position: Position) -> tuple[list[StreamEvent], Position] | None:
        """The stream's events in the next range of history, or None once caught up with the hub."""
        assert self.pool is not None and self.hub.lower is not None
        if position.lower >= self.hub.lower:
            return None
        async with self.pool.acquire() as conn:
            read = await read_range(conn, stream, position, self.settings.range_events)
        return read if read is not None else ([], position)

    async def _write(self, request: web.Request, response: web.StreamResponse, data: bytes) -> None:
        """Write, but cut the connection off if the client reads nothing for ``stall_timeout``:
        in pieces, each with its own deadline, so that it measures a client that stopped
        reading, not one that reads a range of history (megabytes) slowly but steadily (one
        reading 49 KiB/s was cut off mid-event after 30 s)."""
        view = memoryview(data)
        try:
            for start in range(0, len(view), WRITE_PIECE):
                async with asyncio.timeout(self.settings.stall_timeout):
                    await response.write(view[start : start + WRITE_PIECE])
        except TimeoutError:
            self._let_go("stalled")
            if request.transport is not None:
                request.transport.abort()
            raise

    def _close_once_read(self, transport: asyncio.BaseTransport) -> None:
        """Close the connection once what was written has left the relay's buffers, and abort it
        if the client stops reading before: one that reads nothing more would keep it (and its
        buffers) forever. Aborting it a fixed stall_timeout after the last write cut off a client
        still reading megabytes of history, with the end event unsent."""
        loop = asyncio.get_running_loop()
        left = transport.get_write_buffer_size()  # type: ignore[attr-defined]

        def check() -> None:
            nonlocal left
            if transport.is_closing():
                return
            size = transport.get_write_buffer_size()  # type: ignore[attr-defined]
            if size == 0:
                transport.close()  # the kernel sends what it holds, then the FIN
            elif size >= left:
                transport.abort()  # type: ignore[attr-defined]  # no progress for stall_timeout
            else:
                left = size
                loop.call_later(self.settings.stall_timeout, check)

        loop.call_later(self.settings.stall_timeout, check)

    async def _revoked(self, request: web.Request, stream: str) -> str | None:
        """Why an open stream's token no longer lets it read (revoked, or its patterns changed),
        or None. The tokens are reloaded every few seconds (``TokenStore``), so this costs a
        lookup; while they cannot be reloaded the stream goes on (nothing new is read then)."""
        if self.settings.allow_loopback and is_loopback(request.remote or ""):
            return None
        assert self.authorizer is not None
        try:
            decision = await self.authorizer.authorize(_bearer(request), stream, "read")
        except TokenStoreUnavailable:
            return None
        if decision.status == 200:
            return None
        why = "is no longer valid (revoked)" if decision.status == 401 else "may no longer read this stream"
        return f"this API token {why}: the stream ends here; reconnect with a token that may read it"

    def _let_go(self, reason: str) -> None:
        self.stats.let_go[reason] = self.stats.let_go.get(reason, 0) + 1

    async def _serve_sse(self, request: web.Request, response: web.StreamResponse, stream: str,
                         position: Position) -> None:  # fmt: skip
        last = position.floor
        span = min(FIRST_SPAN, self.settings.range_events)
        assert self.hub.lower is not None
        while True:  # history, a range at a time, then live, and history again if live outran the client
            if position.lower >= self.hub.lower:  # caught up with the hub: follow live
                follower = Follower(stream, self.settings.client_buffer, last)
                if not self.hub.join(follower, position.lower):
                    continue
                try:
                    behind = await self._live(request, response, follower)
                finally:
                    self.hub.leave(follower)
                if not behind:
                    return
                # More events came at once than client_buffer holds (a burst in one tick, or a client
                # reading slower than the stream is written): it reads on from the log where it got
                # to. It was cut off with an error, and a burst of 1,500 events cut every client of
                # the stream at once, to come back and read the same history together (outside probe).
                self._let_go("behind")
                last = follower.after
                assert self.pool is not None
                async with self.pool.acquire() as conn:
                    try:
                        resumed = await start(conn, stream, last)
                    except OffsetExpired as exc:
                        await self._error_event(request, response, str(exc))
                        return
                if resumed is None:
                    return
                position = resumed
                continue
            sent, moved = 0, position
            try:
                # (closed when left early, at the stream's end: a range read in pages holds a connection)
                async with contextlib.aclosing(self._history_pages(stream, position, span)) as pages:
                    async for page, moved in pages:  # noqa: B007 - used after
                        end = next((i for i, e in enumerate(page) if is_end(e.headers)), None)
                        if not page:
                            continue
                        frames = b"".join(map(_frame, page if end is None else page[: end + 1]))
                        last = page[-1 if end is None else end].offset
                        del page  # (held while the frames were written, they doubled the memory)
                        sent += len(frames)
                        await self._write(request, response, frames)
                        if end is not None:
                            return
            except OffsetExpired as exc:  # retention dropped the range before this client read it
                await self._error_event(request, response, str(exc))
                return
            position = moved
            if sent > HISTORY_BYTES:
                span = max(1, span // 2)
            elif sent < HISTORY_BYTES // 4:
                span = min(self.settings.range_events, span * 2)

    async def _history_pages(
        self, stream: str, position: Position, span: int
    ) -> AsyncGenerator[tuple[list[StreamEvent], Position], None]:
        """The stream's events in the next range of history (about ``span`` log events), in pages,
        each with the position after the range; nothing while no newer tick exists. A range of
        one tick larger than ``span``, which ``span`` cannot cut, is read through a cursor on a
        connection of its own (not the pool's, which a slow client would hold), HISTORY_PAGE
        events at a time."""
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            end = await range_end(conn, position, span)
            if end is None:
                return
            # One tick beyond the span (one big transaction): a connection of its own is worth it.
            size = await conn.fetchrow(sql.query("stream_range_size"), position.lower, end)
            assert size is not None
            big_tick = size["ticks"] <= 1 and (size["events"] or 0) > max(span, HISTORY_PAGE)
            events = [] if big_tick else await read_range_to(conn, stream, position, end)
        after = Position(end, position.floor)
        if not big_tick:
            yield events, after
            return
        conn = await db.connect(self.url)
        try:
            async for page in read_tick_in_pages(conn, stream, position, end, HISTORY_PAGE):
                yield page, after
            yield [], after
        finally:
            await conn.close()

    async def _error_event(self, request: web.Request, response: web.StreamResponse, reason: str) -> None:
        await self._write(request, response, b"event: error\ndata: " + orjson.dumps({"reason": reason}) + b"\n\n")

    async def _live(self, request: web.Request, response: web.StreamResponse, follower: Follower) -> bool:
        """Live events as they come, a heartbeat when none do; the token is checked again before
        each write, so a revoked one ends the stream with an ``error`` event. True when more came
        than the follower's buffer holds: the caller reads on from the log."""
        while True:
            follower.wake.clear()
            if revoked := await self._revoked(request, follower.stream):
                self._let_go("revoked")
                await self._error_event(request, response, revoked)
                return False
            if follower.queue:
                frames = list(follower.queue)
                follower.queue.clear()
                await self._write(request, response, b"".join(map(_frame, frames)))
                follower.after = frames[-1].offset
                if is_end(frames[-1].headers):
                    return False
                continue
            if follower.overflowed:
                return True  # what was queued is sent; the rest is read from the log
            try:
                async with asyncio.timeout(self.settings.heartbeat):
                    await follower.wake.wait()
            except TimeoutError:
                await self._write(request, response, b": heartbeat\n\n")

    async def _poll(self, stream: str, position: Position, limit: int, wait: float
                    ) -> tuple[list[StreamEvent], Offset]:  # fmt: skip
        """Up to ``limit`` events after ``position``, up to the stream's end, waiting up to ``wait``
        seconds for one; and the offset to ask from next time."""
        got: list[StreamEvent] = []
        while len(got) < limit:
            try:
                read = await self._history(stream, position)
            except OffsetExpired as exc:
                raise _error(410, str(exc)) from None
            if read is None:
                break
            events, position = read
            got.extend(events)
            if any(is_end(e.headers) for e in events):  # closed: nothing after it is the stream's
                break
        got = _until_end(got)[:limit]
        if got:
            return got, got[-1].offset
        # Nothing of this stream up to tick position.lower: the next poll need not read that again.
        caught_up = max(position.floor, Offset(position.lower, 0))
        if wait <= 0:
            return [], caught_up
        follower = Follower(stream, limit, position.floor)
        if not self.hub.join(follower, position.lower):  # the hub moved on meanwhile: ask again
            return [], caught_up
        try:
            async with asyncio.timeout(wait):
                await follower.wake.wait()
        except TimeoutError:
            pass
        finally:
            self.hub.leave(follower)
        got = _until_end(list(follower.queue))
        if got:
            return got, got[-1].offset
        return [], max(caught_up, Offset(self.hub.lower or 0, 0))


def _until_end(events: list[StreamEvent]) -> list[StreamEvent]:
    """The events up to and with the first end marker."""
    end = next((i for i, e in enumerate(events) if is_end(e.headers)), None)
    return events if end is None else events[: end + 1]


def _bearer(request: web.Request) -> str | None:
    """The token of the Authorization header, else of ``?access_token=`` (EventSource sends no headers)."""
    return bearer_from_header(request.headers.get("Authorization")) or request.query.get("access_token") or None


def _error(
    status: int, reason: str, challenge: str | None = None, headers: dict[str, str] | None = None
) -> web.HTTPException:
    text = orjson.dumps({"error": reason}).decode()
    if challenge:
        headers = {**(headers or {}), "WWW-Authenticate": challenge}
    classes: dict[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 409: web.HTTPConflict,
        410: web.HTTPGone, 503: web.HTTPServiceUnavailable,
    }  # fmt: skip
    return classes[status](text=text, content_type="application/json", headers=headers)


@web.middleware
async def _database_unreachable(request: web.Request, handler: Any) -> web.StreamResponse:
    """503 with the reason, as JSON like every other error (it was a 500 text page and a traceback
    in the log, with --api-allow-loopback and the database down)."""
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except db.CONNECTION_ERRORS as exc:
        raise _error(503, f"the database cannot be reached ({db.describe(exc)}); try again shortly") from None
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        # aiohttp's own answers (405 method, 413 body too large, 404 path) were text: JSON as well
        detail = exc.text if exc.text and exc.text != f"{exc.status}: {exc.reason}" else exc.reason
        return web.json_response(
            {"error": detail}, status=exc.status,
            headers={k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")},
        )  # fmt: skip


def _int(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:  # "²".isdigit(), int("²") fails
        raise _error(400, f"{name} must be a whole number from {low} to {high}")
    return int(raw)


def _float(raw: str | None, name: str, default: float, low: float, high: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw) if raw.isascii() else -1.0
    except ValueError:
        value = -1.0
    if not low <= value <= high:
        raise _error(400, f"{name} must be a number of seconds from {low:g} to {high:g}")
    return value


async def serve(api: StreamsApi, stop: asyncio.Event, announce: Callable[[str], None] | None = None) -> None:
    """Run the API, and the hub it reads from, until ``stop``."""
    await api.open()
    runner = web.AppRunner(
        api.app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=5.0
    )
    hub = asyncio.create_task(api.hub.run(stop))
    try:
        await runner.setup()
        site: web.BaseSite
        if api.settings.listen_fd is not None:
            # The supervisor's socket, inherited: closing this process's copy leaves the others listening.
            site = web.SockSite(runner, socket.socket(fileno=api.settings.listen_fd))
        else:
            site = web.TCPSite(runner, api.settings.host, api.settings.port, reuse_address=True, backlog=4096)
        try:
            await site.start()
        except OSError as exc:
            raise PgferryError(
                f"streams API: cannot listen on {api.settings.host}:{api.settings.port}: {exc.strerror or exc}"
            ) from exc
        bound = runner.addresses[0]
        url = f"http://{f'[{bound[0]}]' if ':' in str(bound[0]) else bound[0]}:{bound[1]}"
        log.info("streams API: serving at %s/v1/streams/", url)
        if announce is not None:
            announce(url)
        await stop.wait()
    finally:
        hub.cancel()
        # Readers never finish by themselves: end them (an EventSource reconnects, to another
        # relay or to this one restarted, after its last offset), then stop serving.
        for reader in list(api.readers):
            reader.cancel()
        await asyncio.gather(hub, *api.readers, return_exceptions=True)
        await runner.cleanup()
        await api.close_pool()
