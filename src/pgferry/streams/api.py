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
(one log read per tick for all clients); history from ranges of the log
(``streams.history``). An SSE client that more than ``client_buffer`` live
events wait for reads on from the log on the same connection; one that reads
nothing for ``stall_timeout`` is cut off, with a line in the log saying how
far behind it was: it loses nothing (it resumes from its last offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol, cast
from urllib.parse import unquote

import asyncpg
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from pgferry import db, sql
from pgferry.api_tokens import Decision, TokenStore, bearer_from_header
from pgferry.errors import PgferryError, TokenStoreUnavailable
from pgferry.limits import FD_RESERVE, raise_open_files
from pgferry.relay.surface import is_loopback
from pgferry.serving import BODY_TIMEOUT, GuardedRunner, is_loopback_name
from pgferry.streams import history
from pgferry.streams.history import History, Pace, resume_point
from pgferry.streams.hub import Follower, StreamHub
from pgferry.streams.offsets import BadOffset, Offset
from pgferry.streams.reader import JsonText, OffsetAhead, OffsetExpired, Position, StreamEvent, is_end, start
from pgferry.streams.settings import DEFAULT_MAX_CLIENTS, ApiSettings

log = logging.getLogger(__name__)


class _UndecodableBodies(logging.Filter):
    """aiohttp drains the body of a request answered without reading it (401, 403, 404), and a
    body its Content-Encoding does not decode failed that drain: "Unhandled exception" at ERROR
    with a 28-line traceback, per request, from anyone who reached the port (outside probe). Such
    a record is kept at DEBUG, one line; aiohttp closes the connection either way."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR and isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            log.debug("streams API: a request body that could not be read was dropped (%s)", " ".join(str(exc).split()))
            return False
        return True


logging.getLogger("aiohttp.server").addFilter(_UndecodableBodies())

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: A '%' not starting a percent-escape.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
MAX_LIMIT = 1000
MAX_WAIT = 30.0
#: The most events one POST may publish, and the largest body.
MAX_PUBLISH = 1000
MAX_BODY = 1 << 20
#: What one write to a reader carries at most: the stall timeout is per piece, so it measures a
#: client that stopped reading, not the time a slow one takes over a range of history.
WRITE_PIECE = 64 * 1024
#: The kernel send buffer of an SSE connection (the kernel doubles it).
SSE_SEND_BUFFER = 128 * 1024
#: Connections the API holds beyond max_clients readers, whatever they are doing: publishes,
#: requests whose head has not come yet, a reader being told 503. Idle connections that sent
#: nothing were never counted, and took all the relay's open files (outside probe); this many of
#: FD_RESERVE may go to them.
SPARE_CONNECTIONS = 64


class Authorizer(Protocol):
    """Who may read or write which stream (``api_tokens.TokenStore``; tests give their own)."""

    async def authorize(self, bearer: str | None, stream: str, action: Literal["read", "write"]) -> Decision: ...


@dataclass
class ApiStats:
    clients: int = 0
    let_go: dict[str, int] = field(default_factory=dict)


@dataclass
class _Sent:
    """How far one SSE response has got: its stream's last event written, and when it was written
    to the log (for the line a cut-off client gets in the log)."""

    stream: str
    offset: Offset
    created_at: datetime | None = None

    def wrote(self, event: StreamEvent) -> None:
        self.offset, self.created_at = event.offset, event.created_at


class _Stalled(TimeoutError):
    """A write waited stall_timeout for a client that read nothing; ``unsent`` bytes were waiting."""

    def __init__(self, unsent: int) -> None:
        super().__init__(f"{unsent} bytes unsent")
        self.unsent = unsent


def _event_json(event: StreamEvent, offset: str | None = None, *, raw: bool = False) -> dict[str, Any]:
    """An event's fields; JSON text (a payload read as text, headers too deep to decode) goes in as
    it is: as orjson Fragments, or with ``raw`` as themselves (for ``_deep_json``)."""
    # created_at stays a datetime: orjson writes it exactly as isoformat() does, in a fraction of the time
    payload, headers = event.payload, cast(Any, event.headers)  # RawJSON when too deep to decode
    if not raw:
        payload = orjson.Fragment(payload.text) if type(payload) is JsonText else payload
        headers = orjson.Fragment(headers) if type(headers) is db.RawJSON else headers
    return {
        "offset": offset or str(event.offset), "id": event.id, "stream": event.stream, "key": event.key,
        "payload": payload, "headers": headers, "created_at": event.created_at,
    }  # fmt: skip


def _json(value: Any) -> bytes:
    """``value`` as JSON. orjson refuses more than 254 levels of nesting, which PostgreSQL's
    jsonb allows: one such event could be neither served nor published (its stream's readers
    reconnected forever, outside probe), so those few go through ``_deep_json``."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _deep_json(value)


def _deep_json(value: Any) -> bytes:
    """``value`` as JSON however deep it is nested, without recursion: the standard library's
    encoder, which this replaced, ran out of Python's stack at about 900 levels, and an event that
    deep answered 500 to every reader of its stream, for good (outside probe). Besides JSON's own
    types: datetimes (isoformat), and text written as it is (``JsonText``: a payload, a published
    number as written, and the punctuation this writes between what it takes off ``todo``; and
    ``RawJSON``)."""
    out: list[str] = []
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if type(item) is JsonText:
            out.append(item.text)
        elif type(item) is dict:
            out.append("{")
            parts: list[Any] = []
            for n, (key, inner) in enumerate(item.items()):
                if not isinstance(key, str):
                    raise TypeError(f"a key of type {type(key).__name__} is not JSON")
                parts += [JsonText(("," if n else "") + orjson.dumps(key).decode() + ":"), inner]
            todo += [JsonText("}"), *reversed(parts)]
        elif type(item) is list:
            out.append("[")
            parts = []
            for n, inner in enumerate(item):
                parts += [JsonText(","), inner] if n else [inner]
            todo += [JsonText("]"), *reversed(parts)]
        elif type(item) is db.RawJSON:
            out.append(str.__str__(item))
        elif isinstance(item, datetime):
            out.append(f'"{item.isoformat()}"')
        else:  # str, int, float, bool, None: orjson's own answer (TypeError for anything else)
            out.append(orjson.dumps(item).decode())
    return "".join(out).encode()


def _event_bytes(event: StreamEvent, offset: str | None = None) -> bytes:
    """An event as JSON; a payload read as text goes in as it is."""
    try:
        return orjson.dumps(_event_json(event, offset))
    except orjson.JSONEncodeError:  # nested too deep for orjson, in its headers
        return _deep_json(_event_json(event, offset, raw=True))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_body(raw: bytes) -> tuple[Any, bool]:
    """A publish's body, and whether its numbers were kept as they were written (``JsonText``:
    ``19.90``, ``1e400``, 30 digits).
    orjson reads numbers that are not 64-bit integers as doubles, and they were published rounded
    (``19.90`` as ``19.9``, 30 digits as 17; outside probe) where ``ferry.publish`` in SQL keeps
    them (jsonb numbers are ``numeric``): a body with such a number is read again with every
    number kept as its text, and so is one orjson refuses (``1e400`` is a double's infinity, but
    a jsonb number like any other)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        fast_error: str | None = str(exc)
    else:
        if not _has_float(body):
            return body, False
        fast_error = None
    try:
        body = json.loads(raw.decode(), parse_float=JsonText, parse_int=JsonText, parse_constant=_reject_constant)
        # a lone surrogate ("\\ud800"), which orjson refuses, as PostgreSQL would: UnicodeEncodeError
        json.dumps(body, default=lambda _: None, ensure_ascii=False).encode()
        return body, True
    except RecursionError:
        raise _error(400, "the body is nested deeper than this API reads (about 900 levels); publish it with "
                          "ferry.publish in SQL, which takes JSON as deep as PostgreSQL does") from None  # fmt: skip
    except (UnicodeDecodeError, ValueError) as exc:
        raise _error(400, f"the body is not JSON: {fast_error or exc}") from None


def _has_float(value: Any) -> bool:
    todo = [value]
    while todo:
        value = todo.pop()
        if type(value) is float:
            return True
        if type(value) is dict:
            todo.extend(value.values())
        elif type(value) is list:
            todo.extend(value)
    return False


def _digits_json(payload: Any, i: int) -> str:
    """A payload whose numbers were read as ``JsonText``, as JSON text with those numbers as written."""
    try:
        return _deep_json(payload).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise _error(400, f"event #{i}: the payload cannot be published: {exc}") from None


#: What a page's requests may carry: fetch-based SSE readers send Cache-Control (and Accept), and
#: their preflight was refused with Authorization, Content-Type and Last-Event-ID only (outside probe).
CORS_ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID, Cache-Control, Accept"
#: The SSE route's name: its transient failures are answered so that EventSource reconnects.
SSE_ROUTE = "sse"
#: Seconds a client waits before it tries again when the database or the tokens cannot be read.
TRANSIENT_RETRY = 2
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _frame(event: StreamEvent) -> bytes:
    """An event's SSE frame, ``id:`` last: the standard takes the fields in any order, but
    eventsource@2 (Node) takes the id as the one to resume after as soon as it reads the line, not
    when the event is dispatched, and a connection cut inside the (long) ``data:`` line that came
    after it resumed after an event it never had (62 of 2,694 lost with random cuts; outside probe)."""
    if is_end(event.headers):
        return f"event: end\ndata: {{}}\nid: {event.offset}\n\n".encode()
    offset = str(event.offset)  # once per event: catch-ups frame a million of them
    return b"".join((b"data: ", _event_bytes(event, offset), b"\nid: ", offset.encode(), b"\n\n"))


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
        self.history = History(url, settings.history_connections)
        self.stats = ApiStats()
        #: the requests that read (SSE, long-polls): ended when the relay stops
        self.readers: set[asyncio.Task[Any]] = set()
        #: set when the relay stops: an SSE response ended then ends with HTTP's last chunk
        self.stopping = False
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[_transient_failures])
        self.app.on_response_prepare.append(self._cors)
        self.app.router.add_get("/v1/streams/{name}", self.sse, name=SSE_ROUTE)
        self.app.router.add_get("/v1/streams/{name}/events", self.events)
        self.app.router.add_post("/v1/streams/{name}", self.publish)
        self.app.router.add_post("/v1/streams/{name}/close", self.close)
        self.app.router.add_route("OPTIONS", "/v1/streams/{tail:.*}", self.preflight)
        self.app.router.add_route("*", "/v1/streams/{tail:.*}", self.no_such_route)

    async def open(self) -> None:
        # stateless: nothing here leaves session state on a connection, so releasing one needs no reset
        # round trip (a connecting client took 7 round trips, 2 of them resets)
        self.pool = await db.create_pool(
            self.url, min_size=1, max_size=8, reset=db.rollback_if_open,
            server_settings={"application_name": "pgferry streams api", **db.LOG_READER_SETTINGS},
        )  # fmt: skip
        await self.history.open(self.pool)
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
        await self.history.close()
        if self.pool is not None:
            await self.pool.close()

    # -- requests ----------------------------------------------------------

    async def sse(self, request: web.Request) -> web.StreamResponse:
        stream, after = await self._admit(request, "read", sse=True)
        if request.method == "HEAD":
            return await self._head(stream, after, SSE_HEADERS)
        this = self._enter()
        try:
            position = await self._begin(stream, after)
            if position is None:
                return web.Response(status=204)  # EventSource stops reconnecting
            response = web.StreamResponse(headers=SSE_HEADERS)
            response.force_close()  # a stream's connection is its own; it ends with it
            sock = request.transport.get_extra_info("socket") if request.transport is not None else None
            if sock is not None:
                # A bounded kernel buffer, so that progress shows within stall_timeout: Linux grows
                # a socket's to 4 MB and wakes its writer only once a third of it is free, which
                # took a client reading 49 KiB/s longer than 30 s (cut off mid-history).
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SSE_SEND_BUFFER)
            sent = _Sent(stream, position.floor)
            try:
                await response.prepare(request)
                await self._write(request, response, b"retry: 2000\n\n")
                await self._serve_sse(request, response, position, sent)
            except _Stalled as exc:
                self._cut_off(request, sent, exc.unsent)
            except (ConnectionError, TimeoutError):
                pass  # the client went away
            except asyncio.CancelledError:
                if not self.stopping:
                    raise
                # The relay stops (serve() ended the readers): end the response as HTTP ends one, the
                # last chunk, so that the client sees the stream end rather than a broken body
                # ("incomplete chunked read", outside probe). An EventSource reconnects all the same.
                with contextlib.suppress(ConnectionError, TimeoutError, RuntimeError):
                    async with asyncio.timeout(1):
                        await response.write_eof()
                return response
            if request.transport is not None:
                self._close_once_read(request.transport)
            return response
        finally:
            self._leave(this)

    async def events(self, request: web.Request) -> web.StreamResponse:
        stream, after = await self._admit(request, "read", sse=False)
        limit = _int(request.query.get("limit"), "limit", 100, 1, MAX_LIMIT)
        wait = _float(request.query.get("wait"), "wait", 0.0, 0.0, MAX_WAIT)
        if request.method == "HEAD":
            return await self._head(stream, after, {"Content-Type": "application/json"})
        this = self._enter()
        try:
            position = await self._begin(stream, after)
            if position is None:
                pieces: list[bytes] = []
                resume: Offset | None = after
                closed = True
            else:
                pieces, resume, closed = await self._poll(stream, position, limit, wait)
        finally:
            self._leave(this)
        # (each event was made JSON as it was read, to count the answer's bytes)
        body = b"".join((b'{"events":[', b",".join(pieces), b'],"next":', _json(resume and str(resume)),
                         b',"closed":', b"true" if closed else b"false", b"}"))  # fmt: skip
        return web.Response(body=body, content_type="application/json")

    async def _head(self, stream: str, after: Offset | None, headers: dict[str, str]) -> web.StreamResponse:
        """HEAD: the GET's status and headers, no body, and no reader taken. The SSE route sent
        its events as a body (which HEAD may not have: the next response on the connection is
        read from it), and held a reader, until the client closed (outside probe)."""
        if await self._begin(stream, after) is None:
            return web.Response(status=204)
        return web.StreamResponse(headers=headers)  # (no Content-Length: the GET's is not known without reading)

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
            async with asyncio.timeout(BODY_TIMEOUT):  # one that promised a body and sent none held on for good
                raw = await request.read()
        except TimeoutError:
            raise _error(408, f"the body did not arrive within {BODY_TIMEOUT:g} s") from None
        except (HttpProcessingError, RequestPayloadError) as exc:  # e.g. a Content-Encoding that does not decode
            raise _error(400, f"the body cannot be read: {' '.join(str(exc).split())}") from None
        body, digits = _parse_body(raw)
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
            payloads.append(_digits_json(item["payload"], i) if digits else _json(item["payload"]).decode())
            keys.append(key)
            headers.append(_json(head).decode() if head is not None else None)
        assert self.pool is not None
        try:
            async with self.pool.acquire() as conn:
                row = await conn.fetchrow(sql.query("stream_publish"), stream, payloads, keys,
                                          headers if any(h is not None for h in headers) else None)  # fmt: skip
        except asyncpg.PostgresError as exc:
            raise _error(409 if exc.sqlstate == "55000" else 400, str(exc)) from None
        assert row is not None
        if row["captured"] is not None:  # a token for public.* could write events that look like the table's changes
            raise _error(409, f"stream {stream!r} is written by the capture of table {row['captured']}; the "
                         "API publishes into no captured table's stream: publish to another name")  # fmt: skip
        return web.Response(status=201, body=orjson.dumps({"ids": row["ids"]}), content_type="application/json")

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

    async def no_such_route(self, request: web.Request) -> web.Response:
        """404 for a path the API does not serve (it was a 405: the preflight's route matched every
        path), 405 with Allow for a method a served path does not take; JSON like every error."""
        parts = request.raw_path.split("?", 1)[0].removeprefix("/v1/streams/").split("/")  # a%2Fb is one name
        allowed = {1: "GET, POST", 2: {"events": "GET", "close": "POST"}.get(parts[-1])}.get(len(parts))
        if not parts[0] or not allowed:
            return web.json_response(
                {"error": "no such endpoint; the API serves /v1/streams/{name} (GET: SSE, POST: publish), "
                          "/v1/streams/{name}/events (GET) and /v1/streams/{name}/close (POST)"},
                status=404,
            )  # fmt: skip
        return web.json_response(
            {"error": f"{request.method} is not served here; use {allowed}"}, status=405, headers={"Allow": allowed}
        )

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
        if _BAD_ESCAPE.search(segment):  # kept as text too: %ZZ named the stream "%ZZ"
            raise _error(400, "a '%' in the path starts an escape of two hex digits (a '%' itself is %25)")
        if self._loopback_grant(request):
            if action == "write":
                self._check_cross_site(request)
        else:
            assert self.authorizer is not None
            try:
                decision = await self.authorizer.authorize(_bearer(request), stream, action)
            except TokenStoreUnavailable as exc:
                raise _error(503, f"{exc}; try again shortly", headers={"Retry-After": str(TRANSIENT_RETRY)}) from None
            if decision.status != 200:
                raise _error(decision.status, decision.reason, decision.challenge)
        raw = request.headers.get("Last-Event-ID") if sse else None
        raw = raw or request.query.get("after")
        try:
            return stream, Offset.parse(raw) if raw else None
        except BadOffset as exc:
            raise _error(400, str(exc)) from None

    def _loopback_grant(self, request: web.Request) -> bool:
        """Whether a request needs no token: --api-allow-loopback, from a loopback address, to a
        loopback host name. Any page a browser on the host loads can reach loopback, and through
        DNS rebinding under its own name: without the Host check such a page read every stream
        (outside probe); with it, it is asked for a token like anyone else."""
        return (
            self.settings.allow_loopback
            and is_loopback(request.remote or "")
            and is_loopback_name(request.url.host or "")
        )

    def _check_cross_site(self, request: web.Request) -> None:
        """A write let in without a token must be one no other site can make a browser send: its
        body declared JSON (which a cross-site page can send only after a CORS preflight, that this
        API answers only for the listed origins), and no Origin but a listed one. A page anywhere
        published (Content-Type: text/plain, parsed as JSON all the same) and closed streams."""
        if request.content_type != "application/json":
            raise _error(415, "a request without a token publishes or closes with Content-Type: application/json")
        origin = request.headers.get("Origin")
        origins = self.settings.cors_origins
        if origin is not None and not ("*" in origins or origin in origins):
            raise _error(403, f"origin {origin!r} may not write here; list it with --api-cors-origin")

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
            response.headers["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = "600"
        else:  # what a page may read of an answer beyond the safelisted headers (why a 401, when to retry)
            response.headers["Access-Control-Expose-Headers"] = "WWW-Authenticate, Retry-After"

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
            unsent = len(view) - start
            if request.transport is not None:
                unsent += request.transport.get_write_buffer_size()
                request.transport.abort()
            raise _Stalled(unsent) from None

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
        if self._loopback_grant(request):
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

    def _cut_off(self, request: web.Request, sent: _Sent, unsent: int) -> None:
        """One line for a client cut off as stalled: which stream, who, and how far behind."""
        ticks = (self.hub.lower or sent.offset.tick) - sent.offset.tick
        if sent.created_at is None:
            where = "with no event sent yet"
        else:
            age = (datetime.now(sent.created_at.tzinfo) - sent.created_at).total_seconds()
            where = f"sent up to offset {sent.offset} (an event written {age:.0f} s ago)"
        log.warning("streams API: cut off an SSE reader of stream %r from %s: it read nothing for %g s, %s, "
                    "%d ticks behind the log, %d KiB unsent; it may reconnect and resume",
                    sent.stream, request.remote, self.settings.stall_timeout, where, ticks, unsent // 1024)  # fmt: skip

    async def _serve_sse(self, request: web.Request, response: web.StreamResponse, position: Position,
                         sent: _Sent) -> None:  # fmt: skip
        stream = sent.stream
        last = position.floor
        pace = Pace(self.settings.range_events)
        assert self.hub.lower is not None
        while True:  # history, a range at a time, then live, and history again if live outran the client
            if position.lower >= self.hub.lower:  # caught up with the hub: follow live
                follower = Follower(stream, self.settings.client_buffer, last)
                if not self.hub.join(follower, position.lower):
                    continue
                try:
                    behind = await self._live(request, response, follower, sent)
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
            moved = position
            try:
                # (closed when left early, at the stream's end: a tick read in pages holds a connection)
                reading = self.history.read_on(stream, position, pace, lambda: self.hub.lower or 0)
                async with contextlib.aclosing(reading) as pages:
                    async for page, moved in pages:  # noqa: B007 - used after
                        if not page:
                            continue
                        end = next((i for i, e in enumerate(page) if is_end(e.headers)), None)
                        frames = b"".join(map(_frame, page if end is None else page[: end + 1]))
                        pace.framed(len(page), len(frames))
                        final = page[-1 if end is None else end]
                        last = final.offset
                        del page  # (held while the frames were written, they doubled the memory)
                        await self._write(request, response, frames)
                        sent.wrote(final)
                        if end is not None:
                            return
            except OffsetExpired as exc:  # retention dropped the range before this client read it
                await self._error_event(request, response, str(exc))
                return
            position = moved

    async def _error_event(self, request: web.Request, response: web.StreamResponse, reason: str) -> None:
        await self._write(request, response, b"event: error\ndata: " + orjson.dumps({"reason": reason}) + b"\n\n")

    async def _live(self, request: web.Request, response: web.StreamResponse, follower: Follower, sent: _Sent) -> bool:
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
                sent.wrote(frames[-1])
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
                    ) -> tuple[list[bytes], Offset, bool]:  # fmt: skip
        """Up to ``limit`` events after ``position`` as JSON, and about HISTORY_BYTES of them at
        most, up to the stream's end, waiting up to ``wait`` seconds for one; the offset to ask from
        next time; whether the stream's end is reached."""
        pieces, last, closed, position = await self._poll_history(stream, position, limit)
        if pieces or closed:
            return pieces, last, closed
        # Nothing of this stream up to tick position.lower: the next poll need not read that again.
        caught_up = resume_point(position)
        if wait <= 0:
            return [], caught_up, False
        follower = Follower(stream, limit, position.floor)
        if not self.hub.join(follower, position.lower):  # the hub moved on meanwhile: ask again
            return [], caught_up, False
        try:
            async with asyncio.timeout(wait):
                await follower.wake.wait()
        except TimeoutError:
            pass
        finally:
            self.hub.leave(follower)
        got = _until_end(list(follower.queue))
        if got:
            return (
                [_event_bytes(e) for e in got if not is_end(e.headers)],
                got[-1].offset,
                is_end(got[-1].headers),
            )
        return [], max(caught_up, Offset(self.hub.lower or 0, 0)), False

    async def _poll_history(
        self, stream: str, position: Position, limit: int
    ) -> tuple[list[bytes], Offset, bool, Position]:
        """What ``_poll`` answers from history: the JSON of the events, the offset of the last one,
        whether it is the stream's end, and how far the log was read when none came. It reads no
        more than it answers with: a tick of more events than ``limit`` is read in pages up to
        them (a poll of 1,000 events of a 10,000-event tick read the whole tick, and a giant tick
        was loaded whole)."""
        pieces: list[bytes] = []
        size = 0
        last = position.floor
        pace = Pace(self.settings.range_events)
        reading = self.history.read_on(stream, position, pace, lambda: self.hub.lower or 0, rows=limit, prefetch=False)
        try:
            async with contextlib.aclosing(reading) as pages:
                async for page, moved in pages:
                    framed = 0
                    for event in page:
                        if is_end(event.headers):  # closed: nothing after it is the stream's
                            return pieces, event.offset, True, position
                        piece = _event_bytes(event)
                        pieces.append(piece)
                        framed += len(piece)
                        last = event.offset
                        if len(pieces) >= limit or size + framed >= history.HISTORY_BYTES:
                            return pieces, last, False, position  # (may end inside a tick: resumed from last)
                    size += framed
                    pace.framed(len(page), framed)
                    position = moved
        except OffsetExpired as exc:
            raise _error(410, str(exc)) from None
        return pieces, last, False, position


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
        400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 408: web.HTTPRequestTimeout,
        409: web.HTTPConflict, 410: web.HTTPGone, 415: web.HTTPUnsupportedMediaType, 503: web.HTTPServiceUnavailable,
    }  # fmt: skip
    return classes[status](text=text, content_type="application/json", headers=headers)


@web.middleware
async def _transient_failures(request: web.Request, handler: Any) -> web.StreamResponse:
    """The database unreachable: 503 with the reason, as JSON like every other error (it was a 500
    text page and a traceback in the log, with --api-allow-loopback and the database down). On
    the SSE route, a 503 (the database, the tokens that cannot be loaded, the readers' limit) is
    a ``200`` that tells the client to reconnect (``_reconnect_later``)."""
    try:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except db.CONNECTION_ERRORS as exc:
            raise _error(
                503, f"the database cannot be reached ({db.describe(exc)}); try again shortly",
                headers={"Retry-After": str(TRANSIENT_RETRY)},
            ) from None  # fmt: skip
    except web.HTTPException as exc:
        if exc.status == 503 and request.match_info.route.name == SSE_ROUTE:
            return _reconnect_later(exc)
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        # aiohttp's own answers (405 method, 413 body too large, 404 path) were text: JSON as well
        detail = exc.text if exc.text and exc.text != f"{exc.status}: {exc.reason}" else exc.reason
        return web.json_response(
            {"error": detail}, status=exc.status,
            headers={k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")},
        )  # fmt: skip


def _reconnect_later(refused: web.HTTPException) -> web.Response:
    """What an SSE request gets for a failure that passes (``refused``, a 503): ``200`` with a
    ``retry:`` of one to two times the 503's Retry-After (spread, so that the clients of a relay
    do not all come back at once) and a comment saying why, then the end of the response. An
    ``EventSource`` stops for good on any answer but 200 (a page lost its stream for good when the
    database was down a moment, or the relay had its readers' limit; outside probe); a response
    that ends is a dropped connection to it: it reconnects after ``retry`` ms, from its last id."""
    base = 1000 * int(refused.headers.get("Retry-After") or TRANSIENT_RETRY)
    try:
        why = orjson.loads(refused.text or "")["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        why = refused.reason
    why = " ".join(str(why).split())  # one line: a comment ends at the line's end
    body = f": {refused.status} {why}\nretry: {base + random.randrange(base + 1)}\n\n"
    return web.Response(body=body.encode(), headers=SSE_HEADERS)


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


def fit_open_files(settings: ApiSettings) -> ApiSettings:
    """Raise this process's soft limit of open files to its hard limit (each reader is a socket,
    and the soft limit is often 1,024: 10,000 clients connecting at once were refused with
    EMFILE), and cap ``max_clients`` at what the limit leaves room for, saying so in the log."""
    soft = raise_open_files("streams API", settings.max_clients + FD_RESERVE)
    room = soft - FD_RESERVE if soft is not None else settings.max_clients
    if settings.max_clients <= room:
        return settings
    capped = max(1, room)
    # Only a limit the operator asked for is worth a warning; the default (20,000) is a ceiling,
    # and a machine whose hard limit is a little under it (20,000 here) should not warn at every start.
    asked = settings.max_clients != DEFAULT_MAX_CLIENTS
    log.log(
        logging.WARNING if asked else logging.INFO,
        "streams API: serving %d readers at most, not %d: this process may open %d files, "
        "%d of them kept for the rest; raise the limit (ulimit -n, systemd LimitNOFILE=) to serve more",
        capped, settings.max_clients, soft, FD_RESERVE,
    )  # fmt: skip
    return replace(settings, max_clients=capped)


async def serve(api: StreamsApi, stop: asyncio.Event, announce: Callable[[str], None] | None = None) -> None:
    """Run the API, and the hub it reads from, until ``stop``."""
    api.settings = fit_open_files(api.settings)
    await api.open()
    runner = GuardedRunner(
        api.app, name="streams API", max_connections=api.settings.max_clients + SPARE_CONNECTIONS,
        idle_timeout=api.settings.idle_timeout, handler_cancellation=True, shutdown_timeout=5.0,
    )  # fmt: skip
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
        api.stopping = True
        for reader in list(api.readers):
            reader.cancel()
        await asyncio.gather(hub, *api.readers, return_exceptions=True)
        await runner.cleanup()
        await api.close_pool()
