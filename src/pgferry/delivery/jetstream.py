"""The NATS JetStream sink: each event is one message, published with an acknowledgement.

A subscription's URL ``nats://host:4222/<subject template>`` names the
subject (``delivery.destinations``); a JetStream stream must capture it (the
operator creates streams: their limits, replicas and retention are policy).
Each event is a message whose data is the event's payload exactly as stored
(the body a webhook with batch_size 1 gets) and whose headers are the
subscription's headers, the event's headers, ``webhook-id``,
``pgferry-stream`` and ``pgferry-key``. A chunk of ``batch_size`` events is
published at once and succeeds when JetStream acknowledged every message.

Exactly-once handoff: every message carries ``Nats-Msg-Id``
``<subscription>/<webhook-id>``, so a message re-sent after a relay died
between JetStream's acknowledgement and pgferry's bookkeeping is dropped by
the stream's duplicate window (``duplicate_window``, 2 minutes by default)
instead of stored twice. The subscription's name is part of the id so that
two subscriptions publishing the same event into one stream (say, to
``orders.{key}`` and to ``audit.orders``) are not taken for duplicates of
each other. A re-send after the window (a subscription paused for longer
with an unanswered publish in flight) can store a second copy; consumers
that must never see one deduplicate by ``webhook-id``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

# Loaded with the first JetStream subscription's sink, not by its first publish: importing
# nats-py (and aiohttp under it) took ~0.7 s of CPU on a busy relay, in the first events' latency.
import nats.errors
import orjson

from pgferry.delivery import request
from pgferry.delivery.brokers import AckedPublisher, BrokerUnreachable, PublishRefused
from pgferry.delivery.destinations import BadDestination, NatsDestination, parse_nats
from pgferry.delivery.health import Endpoint
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.sink import Prepared, Sink

if TYPE_CHECKING:
    from pgferry.delivery.context import DeliveryContext

#: JetStream's error codes for a message over the stream's max_msg_size (10054) and for headers
#: over the 64 KB it stores (10097, "header size exceeds maximum allowed of 64k").
MESSAGE_TOO_LARGE_CODES = frozenset((10054, 10097))

#: The longest header block JetStream stores (nats-server: math.MaxUint16), "NATS/1.0" line and
#: closing empty line included: one byte more is refused with 10097.
MAX_HEADER_BYTES = 65_535


#: Seconds each JetStream API request of the stream check after an unacknowledged publish may
#: take at most (a frozen server answers none: its attempts take this much longer).
NO_ACK_CHECK_S = 2.0


#: The longest subject a publish may have: a NATS server's max_control_line (4,096 bytes by default)
#: less the rest of the line (HPUB, the reply subject, the sizes).
MAX_SUBJECT_BYTES = 3_840


#: A header name NATS takes (nats-py's check): an HTTP token.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Header names found valid (most are the same few on every message), and the most kept.
_CHECKED_NAMES: set[str] = set()
CHECKED_NAMES_MAX = 10_000
#: What may not be in a subject: it ends the subject, or the line (nats-py refuses it too).
_SUBJECT_BREAK = re.compile(r"\s")


class Message(NamedTuple):
    """A message as AckedPublisher.publish_all takes it (a NamedTuple: a frozen dataclass cost
    twice as much to make, once per event)."""

    subject: str
    data: bytes
    headers: dict[str, str]
    #: the headers as sent (header_block)
    block: bytes

    @property
    def size(self) -> int:
        """What the server counts against max_payload, in bytes: the payload and the whole header
        block. (Without the block's "NATS/1.0\r\n" and closing "\r\n", messages up to 12 bytes
        over the limit passed here; counted in characters, non-ASCII headers did; and the server
        closed the shared connection under every publish on it: outside probes.)"""
        return len(self.data) + len(self.block)


def header_block(headers: Mapping[str, str]) -> bytes:
    """The NATS/1.0 header block of a message as nats-py's publish writes it (names as they are,
    values trimmed); ``request.BadRequest`` for what would break the frame instead of what nats-py
    does (a name that is not a token: refused; CR or LF in a value: turned into spaces)."""
    lines = ["NATS/1.0\r\n"]
    for name, value in headers.items():
        if name not in _CHECKED_NAMES:
            if not _HEADER_NAME.fullmatch(name):
                raise request.BadRequest(f"header name {name!r} is not a valid NATS header name")
            if len(_CHECKED_NAMES) < CHECKED_NAMES_MAX:
                _CHECKED_NAMES.add(name)
        text = value.strip()
        if "\r" in text or "\n" in text:
            raise request.BadRequest(f"header {name!r} contains a line break, which NATS does not allow in a value")
        lines.append(f"{name}: {text}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode()


def dedup_name(sub: Subscription, instance: str) -> str:
    """What a subscription's Nats-Msg-Ids start with: the install's name (ferry.config.instance,
    migration 0034) and the subscription's. Without the first, two databases' subscriptions of
    one name publishing into one stream dropped each other's events as duplicates."""
    return f"{instance}/{sub.name}" if instance else sub.name


def message_of(sub: Subscription, dest: NatsDestination, event: OutEvent, instance: str = "") -> Message:
    """One event as a JetStream message (``request.BadRequest`` if its subject or headers cannot be sent)."""
    webhook_id = request.message_id([event])
    own = {k: v for k, v in sub.headers.items() if k.lower() not in RESERVED}  # saved before subscribe refused them
    try:
        written = event.header_map()
        mine = {k: v for k, v in written.items() if not _reserved_for_writers(k)}
        headers = _framable({**own, **mine})
    except (ValueError, RecursionError) as exc:  # nested deeper than Python decodes; stored fine by PostgreSQL
        raise request.BadRequest(f"event headers cannot be read as a JSON object: {exc!r}") from None
    encoded_names = [name for name, value in headers.items() if not _plain(value)]
    for name in encoded_names:  # raw UTF-8 (or control characters) in a header read as garbage by nats-py
        headers[name] = request.key_header(headers[name].strip())[0]
    if encoded_names:
        headers[ENCODED_HEADERS] = ",".join(encoded_names)
    headers["webhook-id"] = webhook_id
    headers["pgferry-stream"], encoded = request.key_header(event.stream)
    if encoded:
        headers["pgferry-stream-encoding"] = "percent"
    if event.key is not None:
        headers["pgferry-key"], encoded = request.key_header(event.key)
        if encoded:
            headers["pgferry-key-encoding"] = "percent"
    headers["Nats-Msg-Id"] = f"{dedup_name(sub, instance)}/{webhook_id}"
    subject = dest.subject.render(event, subject=True)
    if _inbox(subject):
        error = (f"subject {subject!r} is a subject of the NATS server itself (replies), not one to publish events "
                 "to; the subscription's template made it from the event's stream or key")  # fmt: skip
        raise request.BadRequest(error)
    if not _sendable(subject):
        raise request.BadRequest(f"subject {subject!r} is empty or holds white space, which NATS does not allow")
    return Message(subject, event.payload.encode(), headers, header_block(headers))


#: The header naming the other headers whose values were percent-encoded (comma-separated).
ENCODED_HEADERS = "pgferry-encoded-headers"
#: The header naming the headers whose values were not JSON strings, sent as their JSON text.
JSON_HEADERS = "pgferry-json-headers"
#: The header holding, as a JSON object, the headers whose names NATS cannot carry.
OTHER_HEADERS = "pgferry-other-headers"


def _framable(headers: Mapping[str, Any]) -> dict[str, str]:
    """Every header ferry.publish takes, in a form NATS can frame (docs/sinks.md): a value that is
    not a string (``5``, ``null``, ``true``, an object) as its JSON text, its name listed in
    ``pgferry-json-headers``; headers whose names are not tokens (a space, a colon, none at all,
    non-ASCII) together as one JSON object in ``pgferry-other-headers``. (Values that are not
    printable ASCII, CR and LF too, are percent-encoded after this, by message_of.) Each was a
    ``bad_request`` dead letter that no ``dlq replay`` could deliver (outside probe)."""
    framed: dict[str, str] = {}
    as_json: list[str] = []
    other: dict[str, Any] = {}
    for name, value in headers.items():
        if not (name in _CHECKED_NAMES or _HEADER_NAME.fullmatch(name)):
            other[name] = value
        elif isinstance(value, str):
            framed[name] = value
        else:
            framed[name] = _json_text(value)
            as_json.append(name)
    if as_json:
        framed[JSON_HEADERS] = ",".join(as_json)
    if other:
        framed[OTHER_HEADERS] = _json_text(other)
    return framed


def _json_text(value: Any) -> str:
    """Compact JSON of a header value as ``OutEvent.header_map`` reads it, its numbers exactly as
    written (a ``Decimal`` as its own digits; orjson has no such type)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_text(str(k))}:{_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # any size
    return orjson.dumps(value).decode()


def _plain(value: str) -> bool:
    """A header value sent as it is: printable ASCII (nats-py decodes header values as UTF-8 with
    no error handling it lets one choose, and many clients as Latin-1)."""
    return value.isascii() and value.isprintable()


def _reserved_for_writers(name: str) -> bool:
    """A header an event's writer may not set: pgferry's own, and every ``Nats-`` header, which
    JetStream acts on (``Nats-Rollup: all`` from ferry.publish purged the stream; ``Nats-TTL``,
    ``Nats-Expected-*``): a writer may only append. A subscription's own headers are an
    operator's, and may set those."""
    lowered = name.lower()
    return lowered in RESERVED or lowered.startswith("nats-")


def _sendable(subject: str) -> bool:
    """Whether NATS takes ``subject`` (not empty, no white space) and it is not a reply subject
    of the server's (``_INBOX``, refused at subscribe when written, and rendered by a template from
    a stream ``_INBOX.abc`` or a key ``_INBOX``: an outside probe's events went there)."""
    return bool(subject) and not _SUBJECT_BREAK.search(subject) and not _inbox(subject)


def _inbox(subject: str) -> bool:
    return subject == "_INBOX" or subject.startswith("_INBOX.")


#: Headers a subscription's own may not set (message_of leaves them out): those a webhook request
#: does not take from it, and JetStream's duplicate check (ferry._check_headers_map refuses them all).
RESERVED = request.RESERVED | {"nats-msg-id", "pgferry-stream-encoding", ENCODED_HEADERS, JSON_HEADERS, OTHER_HEADERS}
#: Stream header lines kept by a sink's _Messages (a subscription has few streams).
STREAM_LINES_MAX = 1_000


class _Messages:
    """``message_of`` for one subscription and destination, with what every event shares worked
    out once: the subscription's header lines, the subject of a fixed template, the stream
    header lines. It was ~20% of a relay's CPU publishing to JetStream (py-spy, ``bench sinks``).
    What it makes is what message_of makes (property test, tests/delivery/test_jetstream_frames.py);
    events with headers of their own, and subscriptions whose headers message_of overrides, take
    message_of itself."""

    def __init__(self, sub: Subscription, dest: NatsDestination, instance: str = "") -> None:
        self.sub, self.dest, self.instance = sub, dest, instance
        self.dedup = dedup_name(sub, instance)
        self.general = any(
            k.lower() in RESERVED or not isinstance(v, str) or not _plain(v) for k, v in sub.headers.items()
        )
        self.general = self.general or "\r" in sub.name or "\n" in sub.name
        self.head = ""
        if not self.general:
            try:
                self.head = header_block(sub.headers)[:-2].decode()  # without the closing empty line
            except request.BadRequest:
                self.general = True
        self.msg_id_start = f"Nats-Msg-Id: {self.dedup.lstrip()}/"  # a value is sent trimmed (header_block)
        self.subject: str | None = None
        if dest.subject.fixed:
            self.subject = dest.subject.name
            if not _sendable(self.subject):
                self.general = True  # message_of refuses it, event by event
        self.stream_lines: dict[str, str] = {}

    def __call__(self, event: OutEvent) -> Message:
        if self.general or event.headers:
            return message_of(self.sub, self.dest, event, self.instance)
        webhook_id = request.message_id((event,))
        stream_line = self.stream_lines.get(event.stream)
        if stream_line is None and request.key_header(event.stream)[1]:
            return message_of(self.sub, self.dest, event, self.instance)  # its stream percent-encoded there
        if stream_line is None:
            stream_line = header_block({"pgferry-stream": event.stream})[10:-2].decode()
            if len(self.stream_lines) < STREAM_LINES_MAX:
                self.stream_lines[event.stream] = stream_line
        headers = {**self.sub.headers, "webhook-id": webhook_id, "pgferry-stream": event.stream}
        lines = [self.head, "webhook-id: ", webhook_id, "\r\n", stream_line]
        if event.key is not None:
            # key_header's value has no white space at its ends and no line break: sent as it is
            value, encoded = request.key_header(event.key)
            headers["pgferry-key"] = value
            lines += ("pgferry-key: ", value, "\r\n")
            if encoded:
                headers["pgferry-key-encoding"] = "percent"
                lines.append("pgferry-key-encoding: percent\r\n")
        headers["Nats-Msg-Id"] = f"{self.dedup}/{webhook_id}"
        lines += (self.msg_id_start, webhook_id, "\r\n\r\n")
        subject = self.subject
        if subject is None:
            subject = self.dest.subject.render(event, subject=True)
            if not _sendable(subject):
                return message_of(self.sub, self.dest, event, self.instance)  # refused there, with the reason
        return Message(subject, event.payload.encode(), headers, "".join(lines).encode())


class JetStreamSink(Sink):
    def __init__(self, sub: Subscription, ctx: DeliveryContext) -> None:
        super().__init__(sub, ctx)
        self.dest: NatsDestination | None = None
        self.problem: str | None = None
        try:
            self.dest = parse_nats(sub.url)
        except BadDestination as exc:  # ferry.subscribe checks the URL: only a row edited by hand gets here
            self.problem = f"subscription URL: {exc}"
        self.message_of = _Messages(sub, self.dest, ctx.instance) if self.dest is not None else None

    @property
    def endpoint(self) -> Endpoint | None:
        return ("nats", self.dest.host, self.dest.port) if self.dest is not None else None

    def prepare(self, chunk: Sequence[OutEvent]) -> Prepared | HttpResult:
        if self.message_of is None:
            return HttpResult(None, "config", self.problem, None, 0.0)
        try:
            messages = [self.message_of(e) for e in chunk]
        except request.BadRequest as exc:
            return HttpResult(None, exc.error_class, str(exc), None, 0.0)
        for m in messages:
            if m.size > self.ctx.max_body_bytes:
                return _too_large(m, self.ctx.max_body_bytes, "the relay's limit (ferry.config.max_body_bytes)")
            if len(m.block) > MAX_HEADER_BYTES:  # JetStream refuses it (10097): retried as rejected, it held its key
                return _headers_too_large(m, "header size exceeds maximum allowed of 64k")
            size = len(m.subject.encode())
            if size > MAX_SUBJECT_BYTES:
                # A longer PUB line makes the server close the connection, and every request on it fails.
                error = (f"the subject of {m.headers['webhook-id']} is {size} bytes, over the {MAX_SUBJECT_BYTES} "
                         "a NATS server's control line leaves it (max_control_line, 4 KB)")  # fmt: skip
                return HttpResult(None, "too_large", error, None, 0.0)
        return messages

    async def send(
        self, chunk: Sequence[OutEvent], prepared: Prepared, on_wire: Callable[[], bool] | None, *, fresh: bool
    ) -> HttpResult:
        assert self.dest is not None
        messages: list[Message] = prepared
        started = time.perf_counter()
        dest = self.dest
        if fresh:
            self.ctx.brokers.forget("nats", dest.host, dest.port)
        try:
            publisher = await self.ctx.brokers.jetstream(dest.host, dest.port, self.sub.credentials)
        except BrokerUnreachable as exc:
            return _failed(exc.error_class, str(exc), started)
        max_payload = publisher.client.max_payload
        for m in messages:
            if m.size > max_payload:
                return _too_large(m, max_payload, f"the max_payload of the NATS server at {dest.address}")
        if on_wire is not None and not on_wire():
            return HttpResult(None, "withdrawn", "not sent", None, 0.0)
        timeout = self.sub.timeout_ms / 1000
        try:
            if self.sub.ordered and len(messages) > 1:
                outcomes = await _publish_in_key_order(publisher, chunk, messages, timeout)
            else:
                outcomes = await publisher.publish_all(messages, timeout)
        except Exception as exc:  # noqa: BLE001 - the connection failed mid-chunk: what the client said
            return _explain(exc, messages[0], dest, max_payload, timeout, started)
        for m, outcome in zip(messages, outcomes, strict=True):
            if outcome is None:
                continue
            no_ack = None
            if isinstance(outcome, TimeoutError):  # the connection stands: the stream may say why
                no_ack = await _unacknowledged(publisher, m, outcomes, dest, timeout, started)
            if no_ack is None and _no_stream(outcome):
                # the attempt is recorded for every event of the chunk: it names all of their subjects
                failed = [x.subject for x, o in zip(messages, outcomes, strict=True) if _no_stream(o)]
                enabled = _offers_jetstream(publisher)
                no_ack = _no_stream_result(list(dict.fromkeys(failed)), outcome, dest, started, enabled=enabled)
            return no_ack if no_ack is not None else _explain(outcome, m, dest, max_payload, timeout, started)
        return HttpResult(None, None, None, None, (time.perf_counter() - started) * 1000)

    def endpoint_down(self) -> None:
        if self.dest is not None:
            self.ctx.brokers.forget("nats", self.dest.host, self.dest.port)


async def _publish_in_key_order(
    publisher: AckedPublisher, chunk: Sequence[OutEvent], messages: Sequence[Message], timeout: float
) -> list[BaseException | None]:
    """An ordered subscription's chunk, in waves: each key's first event, then each key's second,
    and so on, a key stopping at its first failure. Published at once, a key's first event refused
    (a stream full, for now) and its next two stored made the stream hold them 2, 3, 1 once the
    first was retried (outside probe). The chunk fails with that failure, and the events not sent
    go again with it (those stored are duplicates JetStream drops). Keyless events have no order
    to keep: the first wave."""
    waves: list[list[int]] = []
    depth: dict[str, int] = {}
    for i, event in enumerate(chunk):
        wave = 0
        if event.key is not None:
            wave = depth[event.key] = depth.get(event.key, -1) + 1
        if wave == len(waves):
            waves.append([])
        waves[wave].append(i)
    outcomes: list[BaseException | None] = [None] * len(messages)
    stopped: set[str] = set()
    for indices in waves:
        todo = [i for i in indices if chunk[i].key not in stopped]
        if not todo:
            continue
        for i, outcome in zip(todo, await publisher.publish_all([messages[i] for i in todo], timeout), strict=True):
            outcomes[i] = outcome
            key = chunk[i].key
            if outcome is not None and key is not None:
                stopped.add(key)
    return outcomes


async def _unacknowledged(publisher: AckedPublisher, m: Message, outcomes: Sequence[BaseException | None],
                          dest: NatsDestination, timeout: float, started: float) -> HttpResult | None:  # fmt: skip
    """Why JetStream did not acknowledge ``m``, when the stream that captures its subject says
    so: one created with ``no_ack`` stores a message and never answers. Taken for a frozen
    server, that held the subscription and probed it for good, and each probe after the
    duplicate window stored the event again (7 copies in 50 s: outside probe). ``no_ack`` is
    dead-lettered at once, as no retry can be acknowledged; a chunk some of whose messages were
    stored elsewhere fails as ``rejected``, split until this one goes alone. None: the stream
    does not say (a timeout as any other)."""
    found = await publisher.stream_capturing(m.subject, min(timeout, NO_ACK_CHECK_S))
    if found is None or found[1].get("no_ack") is not True:
        return None
    error = (f"stream {found[0]!r} on {dest.address} has no_ack: it never acknowledges, so pgferry cannot "
             f"know {m.subject!r} was stored; recreate it without no_ack")  # fmt: skip
    return _failed("rejected" if any(o is None for o in outcomes) else "no_ack", error, started)


def _explain(exc: BaseException, m: Message, dest: NatsDestination, max_payload: int, timeout: float,
             started: float) -> HttpResult:  # fmt: skip
    """What a failed publish of ``m`` is recorded as."""
    if isinstance(exc, PublishRefused):
        if exc.no_stream:
            return _no_stream_result([m.subject], exc, dest, started)
        if exc.err_code in MESSAGE_TOO_LARGE_CODES:  # the stream's max_msg_size, or JetStream's 64 KB of headers
            return (_headers_too_large(m, exc.description) if exc.err_code == 10097
                    else _too_large(m, None, f"the JetStream stream's max_msg_size ({exc.description})"))  # fmt: skip
        return _failed("rejected", f"JetStream refused subject {m.subject!r}: {exc.description}", started)
    if isinstance(exc, nats.errors.MaxPayloadError):
        return _too_large(m, max_payload, f"the max_payload of the NATS server at {dest.address}")
    if isinstance(exc, nats.errors.TimeoutError | TimeoutError):
        return _failed("timeout", f"no acknowledgement from JetStream for {m.subject!r} within {timeout:g} s", started)
    if isinstance(exc, Exception):
        return _failed("connect", f"NATS at {dest.address}: {type(exc).__name__}: {exc}", started)
    raise exc


def _no_stream(outcome: BaseException | None) -> bool:
    return isinstance(outcome, PublishRefused) and outcome.no_stream


#: Subjects a no_stream attempt names at most.
NO_STREAM_SUBJECTS_SHOWN = 5


def _offers_jetstream(publisher: AckedPublisher) -> bool:
    """Whether the server says it runs JetStream (its INFO's ``jetstream``, left out by a server
    without it); True when this nats-py does not tell."""
    info = getattr(publisher.client, "_server_info", None)
    return not isinstance(info, dict) or bool(info.get("jetstream"))


def _no_stream_result(
    subjects: Sequence[str], exc: BaseException, dest: NatsDestination, started: float, *, enabled: bool = True
) -> HttpResult:
    """A chunk no stream took: the attempt is recorded for each of its events, so it names every
    subject that failed (the first alone named it for all: keys k2 and k0 showed 'nomatch.k1').
    A server without JetStream says so (it was "create one (nats stream add ...)")."""
    answered = "" if str(exc) == "no responders" else f"; {exc}"
    if len(subjects) == 1:
        what, it = f"subject {subjects[0]!r}", "it"
    else:
        shown = ", ".join(map(repr, subjects[:NO_STREAM_SUBJECTS_SHOWN]))
        more = (
            f" and {len(subjects) - NO_STREAM_SUBJECTS_SHOWN} more" if len(subjects) > NO_STREAM_SUBJECTS_SHOWN else ""
        )
        what, it = f"the subjects of this batch ({shown}{more})", "them"
    if not enabled:
        error = (f"JetStream is not enabled on the NATS server at {dest.address} (its INFO does not offer it), and "
                 f"nothing stored {what}; "
                 f"enable it (nats-server -js, or a jetstream block in its configuration){answered}")  # fmt: skip
    else:
        error = (f"no JetStream stream captures {what} on {dest.address} (none, or none whose subjects match {it}); "
                 "create one (nats stream add --subjects ...) or add the subject to a stream's subjects "
                 f"(nats stream edit --subjects ...){answered}")  # fmt: skip
    return _failed("no_stream", error, started)


def _failed(error_class: str, error: str, started: float) -> HttpResult:
    return HttpResult(None, error_class, error, None, (time.perf_counter() - started) * 1000)


def _too_large(m: Message, limit: int | None, whose: str) -> HttpResult:
    over = f"over {limit} bytes, " if limit is not None else ""
    error = f"message for {m.subject!r} is {m.size} bytes, {over}{whose}"
    return HttpResult(None, "too_large", error, None, 0.0)


def _headers_too_large(m: Message, said: str) -> HttpResult:
    error = (f"the headers of the message for {m.subject!r} are {len(m.block)} bytes, over the {MAX_HEADER_BYTES} "
             f"JetStream stores ({said})")  # fmt: skip
    return HttpResult(None, "too_large", error, None, 0.0)
