"""Property tests for ``delivery.http1.ResponseReader``, the hand-written response framer,
held to a stricter bar than the parsers it replaced.

Hypothesis generates responses (HTTP/1.0 and 1.1, any status from 200 to 599, reason
phrases, repeated headers, framing by Content-Length, by chunks with extensions and trailers,
or by closing; up to three interim 1xx answers before them) and checks that:

1. a response reads the same in one piece and split at any byte boundaries, and as the
   generator meant it;
2. h11 and llhttp (through httptools) read it as ResponseReader does, wherever it is valid
   for them;
3. a response followed by any bytes at all reads exactly as it does alone, and the bytes
   after it are flagged; and any bytes at all end in a response, a ProtocolError or
   Truncated, with bounded memory, the same however they are split;
4. through the real client and a socket on 127.0.0.1, whatever bytes answer a first
   request, the second request gets its own answer.

Where ResponseReader is deliberately more lenient than h11 and llhttp (each tested with an
explicit example below, and kept out of the oracle comparisons that would refuse it):
- header names with spaces (``Spaces In Name: x``), which curl accepts and pg_net records:
  h11 and llhttp refuse the whole response;
- bare LF line ends: h11 accepts them in a head (not on chunk lines), llhttp refuses them;
- obs-fold (a header line continued by a line starting with whitespace): h11 joins the
  parts with one space as ResponseReader does, llhttp refuses it;
- blank lines before a status line are skipped (llhttp does so too, h11 refuses them).
Differences that are not leniency: an HTTP/1.0 response with ``Connection: keep-alive``
keeps the connection (as llhttp does; h11 never keeps HTTP/1.0 alive), but not with
``keep-alive, close`` or with a Transfer-Encoding (RFC 9112 section 6.1), where llhttp keeps
it. Header values lose trailing whitespace, as in h11; llhttp keeps it, so generated values
never end in whitespace.
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import cast

import h11
import httptools
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpResult
from pgferry.delivery.http1 import MAX_HEAD_BYTES, ProtocolError, Response, ResponseReader, Truncated

#: enough for any generated body: the whole body is compared
KEEP_ALL = 1 << 20
#: every ``keep_body`` the reader is tried with in split tests (0 and 7 cut bodies short)
KEEP_BODIES = (0, 7, KEEP_ALL)

TCHAR = "!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits
#: visible ASCII and obs-text: what a header value or reason phrase is made of, between spaces
VCHAR = "".join(map(chr, range(0x21, 0x7F))) + "".join(map(chr, range(0x80, 0x100)))
#: names that frame or keep connections (for ResponseReader or for llhttp): only the generator's
#: framing and Connection fields carry them
SPECIAL = frozenset(("content-length", "transfer-encoding", "connection", "proxy-connection", "upgrade"))
COMMON_NAMES = ("Content-Type", "content-type", "Location", "LOCATION", "Retry-After", "retry-after",
                "Set-Cookie", "Link", "ETag", "X-Request-Id", "Server")  # fmt: skip
CONNECTION_VALUES = ("close", "Close", "keep-alive", "Keep-Alive", "te, close", "x-token")
#: what ResponseReader accepts beyond RFC 9112: bare LF ending a line of a head (status line,
#: header, blank line) or a chunked body's framing (chunk lines, trailers), obs-fold, header names
#: with spaces, and blank lines before a status line; and interim answers in HTTP/1.0, which no
#: server should send (llhttp takes the connection as closed after them)
LENIENCIES = frozenset(("lf-head", "lf-chunk", "fold", "spaced-name", "blank-line", "1xx-in-1.0"))
#: the status the second answer in the client test has; no generated response uses it
SECOND_STATUS = 299


# -- generating responses ----------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A header field: ``words`` joined by ``seps``; ``fold`` continues the value on a new
    line at that separator (obs-fold), with that leading whitespace."""

    name: str
    words: tuple[str, ...]
    seps: tuple[str, ...]
    fold: tuple[int, str] | None = None

    def value(self) -> str:
        """The value as read: a fold reads as one space."""
        return self._joined(" ")

    def line(self, eol: str) -> str:
        """The field on the wire, ending in ``eol``."""
        return f"{self.name}: {self._joined(eol + self.fold[1] if self.fold else '')}{eol}"

    def _joined(self, fold: str) -> str:
        seps = list(self.seps)
        if self.fold is not None:
            seps[self.fold[0]] = fold
        return "".join(s + w for s, w in zip(["", *seps], self.words, strict=True)) if self.words else ""


def plain(name: str, value: str) -> Field:
    return Field(name, (value,) if value else (), ())


@dataclass(frozen=True)
class Message:
    """A generated response: its bytes and what reading them must give."""

    wire: bytes
    interims: tuple[int, ...]
    status: int
    reason: str
    minor: int
    fields: tuple[Field, ...]
    body: bytes  # as sent, before chunking; empty for 204 and 304
    framing: str  # "length", "chunked", "close" (until the connection closes) or "none" (204, 304)
    #: the LENIENCIES it uses
    features: frozenset[str]

    @property
    def transfer_encoded(self) -> bool:
        return any(f.name.strip().lower() == "transfer-encoding" for f in self.fields)

    @property
    def keep_alive(self) -> bool:
        tokens = [t.strip().lower() for f in self.fields if f.name.strip().lower() == "connection"
                  for t in f.value().split(",")]  # fmt: skip
        if self.framing == "close":
            return False
        if self.minor == 1:
            return "close" not in tokens
        return "keep-alive" in tokens and "close" not in tokens and not self.transfer_encoded

    def response(self, keep_body: int = KEEP_ALL) -> Response:
        """What ResponseReader must return."""
        last = {f.name.strip().lower(): f.value() for f in self.fields}
        return Response(
            status=self.status,
            reason=self.reason,
            minor=self.minor,
            headers=[(f.name.strip(), f.value()) for f in self.fields],
            retry_after=last.get("retry-after"),
            location=last.get("location"),
            content_type=last.get("content-type"),
            body=bytearray(self.body[:keep_body]),
            body_bytes=len(self.body),
            keep_alive=self.keep_alive,
        )


statuses = st.one_of(
    st.sampled_from((200, 201, 202, 204, 204, 304, 304, 301, 302, 400, 404, 429, 500, 503)),
    st.integers(200, 599).filter(lambda s: s != SECOND_STATUS),
)
words = st.text(VCHAR, min_size=1, max_size=8)
separators = st.sampled_from((" ", " ", "\t", "  ", " \t"))
reasons = st.lists(st.text(VCHAR, min_size=1, max_size=10), max_size=3).map(" ".join)
tokens = st.text(TCHAR, min_size=1, max_size=12)
names = st.one_of(st.sampled_from(COMMON_NAMES), tokens.filter(lambda n: n.lower() not in SPECIAL))


@st.composite
def fields(draw: st.DrawFn, *, lenient: frozenset[str] = frozenset()) -> Field:
    name = draw(names)
    if "spaced-name" in lenient and draw(st.integers(0, 3)) == 0:  # spaces in the name, or before the colon
        name = draw(st.sampled_from((f"{name} {draw(tokens)}", f"{name} ")))
        if name.strip().lower() in SPECIAL:
            name = "Spaced Name"
    value = draw(st.lists(words, max_size=4))
    seps = tuple(draw(separators) for _ in value[1:])
    fold = None
    if "fold" in lenient and seps and draw(st.integers(0, 3)) == 0:
        fold = (draw(st.integers(0, len(seps) - 1)), draw(st.sampled_from((" ", "\t", "   "))))
    return Field(name, tuple(value), seps, fold)


@st.composite
def chunk_extensions(draw: st.DrawFn) -> str:
    quoted = st.text(string.ascii_letters + string.digits + " !#$%&'()*+,-./:;<=>?@[]^_`{|}~", max_size=8)
    value = st.one_of(st.just(""), tokens.map("={}".format), quoted.map('="{}"'.format))
    return "".join(f";{draw(tokens)}{draw(value)}" for _ in range(draw(st.integers(0, 2))))


@st.composite
def messages(
    draw: st.DrawFn, *, lenient: frozenset[str] = frozenset(), framings: Sequence[str] = ("chunked", "length", "close")
) -> Message:
    """A response as ``Message``. ``lenient``: which of the LENIENCIES it may use (each in about
    a third of the messages)."""
    features: set[str] = set()
    lenient = frozenset(k for k in sorted(lenient) if draw(st.integers(0, 2)) == 0)

    def eol(kind: str) -> str:
        if kind in lenient and draw(st.integers(0, 2)) == 0:
            features.add(kind)
            return "\n"
        return "\r\n"

    def blank_lines() -> str:
        if "blank-line" in lenient and draw(st.integers(0, 2)) == 0:
            features.add("blank-line")
            return draw(st.sampled_from(("\r\n", "\n", "\r\n\r\n")))
        return ""

    def status_line(version: str, status: int, reason: str) -> str:
        space = " " if reason or draw(st.booleans()) else ""  # "HTTP/1.1 200 " and "HTTP/1.1 200"
        return f"{blank_lines()}{version} {status}{space}{reason}{eol('lf-head')}"

    minor = draw(st.sampled_from((0, 1)))
    version = f"HTTP/1.{minor}"
    head = ""
    interims = tuple(draw(st.lists(st.sampled_from((100, 102, 103)), max_size=3)))
    if interims and minor == 0:
        if "1xx-in-1.0" in lenient:
            features.add("1xx-in-1.0")
        else:
            interims = ()
    for status in interims:
        head += status_line(version, status, draw(reasons))
        head += "".join(f.line(eol("lf-head")) for f in draw(st.lists(fields(), max_size=2)))
        head += eol("lf-head")

    status = draw(statuses)
    reason = draw(reasons)
    others = draw(st.lists(fields(lenient=lenient), max_size=6))
    if draw(st.booleans()) and others:  # a repeated header
        others.append(draw(st.sampled_from(others)))
    if any(f.fold for f in others):
        features.add("fold")
    if any(f.name != f.name.strip() or " " in f.name for f in others):
        features.add("spaced-name")
    body = draw(st.one_of(st.binary(max_size=64), st.binary(min_size=64, max_size=2000)))
    framing = draw(st.sampled_from(framings))
    framers: list[Field] = []
    if status in (204, 304):  # no body, whatever the headers say
        framing, body = "none", b""
        framers = draw(st.sampled_from(([], [plain("Content-Length", "42")], [plain("Transfer-Encoding", "chunked")])))
    elif framing == "length":
        framers = [plain(draw(st.sampled_from(("Content-Length", "content-length", "CONTENT-LENGTH"))), str(len(body)))]
    elif framing == "chunked":
        name = draw(st.sampled_from(("Transfer-Encoding", "transfer-encoding")))
        framers = [plain(name, draw(st.sampled_from(("chunked", "Chunked", "CHUNKED"))))]
    connection = draw(st.sampled_from((None, *CONNECTION_VALUES)))
    if connection is not None:
        framers.append(plain(draw(st.sampled_from(("Connection", "connection"))), connection))
    final = tuple(draw(st.permutations(others + framers)))
    head += status_line(version, status, reason)
    head += "".join(f.line(eol("lf-head")) for f in final)
    head += eol("lf-head")

    content = body
    if framing == "chunked":
        chunk_eol = eol("lf-chunk")
        cuts = sorted(set(draw(st.lists(st.integers(1, len(body) - 1), max_size=6)))) if len(body) > 1 else []
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
        chunks = []
        for part in parts:
            size = draw(st.sampled_from(("{:x}", "{:X}", "0{:x}", "00{:X}"))).format(len(part))
            chunks.append(f"{size}{draw(chunk_extensions())}{chunk_eol}".encode() + part + chunk_eol.encode())
        trailers = draw(st.lists(fields(), max_size=2))
        last = f"0{draw(chunk_extensions())}{chunk_eol}" + "".join(f.line(chunk_eol) for f in trailers) + chunk_eol
        content = b"".join(chunks) + last.encode("latin-1")
    elif framing == "none":
        content = b""
    return Message(head.encode("latin-1") + content, interims, status, reason, minor, final, body, framing,
                   frozenset(features))  # fmt: skip


def cuts(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """``data`` cut at hypothesis-chosen points (empty pieces included), or a byte at a time."""
    points = st.lists(st.integers(0, len(data)), max_size=16).map(sorted)
    pieces = points.map(lambda p: [data[a:b] for a, b in zip([0, *p], [*p, len(data)], strict=True)])
    if len(data) <= 4096:
        return st.one_of(st.just([data[i : i + 1] for i in range(len(data))]), pieces)
    return pieces


# -- reading -----------------------------------------------------------------------------


def read(pieces: Iterable[bytes], keep_body: int = KEEP_ALL, keep_headers: bool = True) -> tuple[Response, bool]:
    """(the response, ``extra``) of a valid response, fed piece by piece, then EOF if need be."""
    reader = ResponseReader(keep_body=keep_body, keep_headers=keep_headers)
    got: Response | None = None
    for piece in pieces:
        response = reader.feed(piece)
        if response is not None:
            assert got is None, "a response is returned once"
            got = response
    ended = reader.feed_eof()
    assert got is None or ended is got
    return ended, reader.extra


@dataclass(frozen=True)
class Outcome:
    """How feeding some bytes, then EOF, ended."""

    kind: str  # "response", "refused" (ProtocolError from feed) or "truncated" (Truncated from feed_eof)
    response: Response | None = None
    extra: bool = False


def outcome(pieces: Iterable[bytes], keep_body: int) -> Outcome:
    """Feeds any bytes; checks that memory stays bounded on the way."""
    reader = ResponseReader(keep_body=keep_body, keep_headers=True)
    largest = 0
    got: Response | None = None
    for piece in pieces:
        largest = max(largest, len(piece))
        try:
            response = reader.feed(piece)
        except ProtocolError:
            return Outcome("refused")
        assert len(reader._buf) <= MAX_HEAD_BYTES + largest
        assert len(reader.response.body) <= keep_body
        if response is not None:
            assert got is None, "a response is returned once"
            got = response
    try:
        ended = reader.feed_eof()
    except Truncated as truncated:
        assert got is None and truncated.got_bytes == (largest > 0)
        return Outcome("truncated")
    assert got is None or ended is got
    return Outcome("response", ended, reader.extra)


@dataclass
class Oracle:
    """What another parser made of a response: its final response, and the interims before it."""

    interims: list[int]
    status: int
    reason: bytes
    minor: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool
    complete: bool  # whether the parser saw the response end


def by_h11(wire: bytes) -> Oracle:
    """h11 as a client that sent a GET, then got ``wire`` and the connection's close."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    conn.send(h11.Request(method="GET", target="/hook", headers=[("Host", "example.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(wire)
    conn.receive_data(b"")
    interims: list[int] = []
    final: h11.Response | None = None
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.InformationalResponse):
            interims.append(event.status_code)
        elif isinstance(event, h11.Response):
            final = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert final is not None
            return Oracle(interims, final.status_code, final.reason, int(final.http_version[-1:]),
                          list(final.headers.raw_items()), body, conn.their_state is h11.DONE, True)  # fmt: skip
        else:
            raise AssertionError(f"h11 did not finish the response: {event!r}")


class _Llhttp:
    """httptools callbacks: every message it reads (it reads 1xx answers as messages of their own)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.messages: list[Oracle] = []
        self.in_head = False

    def on_message_begin(self) -> None:
        self.messages.append(Oracle([], 0, b"", 0, [], b"", False, False))
        self.in_head = True

    def on_status(self, reason: bytes) -> None:
        self.messages[-1].reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:  # not the trailers
            self.messages[-1].headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        message = self.messages[-1]
        message.status = self.parser.get_status_code()
        message.minor = int(self.parser.get_http_version()[-1])

    def on_body(self, body: bytes) -> None:
        self.messages[-1].body += body

    def on_message_complete(self) -> None:
        self.messages[-1].keep_alive = self.parser.should_keep_alive()
        self.messages[-1].complete = True


def by_llhttp(wire: bytes) -> Oracle:
    """llhttp (httptools) fed ``wire``. It cannot be told the connection closed, so a body that
    runs until the close is what it got so far, and not complete."""
    seen = _Llhttp()
    seen.parser.feed_data(wire)
    interims = [m.status for m in seen.messages if m.status < 200]
    final = seen.messages[len(interims)]
    if not final.complete:
        final.keep_alive = seen.parser.should_keep_alive()
    final.interims = interims
    return final


def normalized(headers: Iterable[tuple[bytes, bytes]] | Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Names lowercased, and Transfer-Encoding's value too (h11 lowercases both)."""
    out = []
    for name, value in headers:
        n = name.encode("latin-1").lower() if isinstance(name, str) else name.lower()
        v = value.encode("latin-1") if isinstance(value, str) else value
        out.append((n, v.lower() if n == b"transfer-encoding" else v))
    return out


# -- 1. split invariance ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data(), messages(lenient=LENIENCIES), st.sampled_from(KEEP_BODIES))
def test_a_response_reads_as_generated_in_one_piece_and_split_at_any_byte_boundaries(
    data: st.DataObject, message: Message, keep_body: int
) -> None:
    whole = read([message.wire], keep_body)
    assert whole == (message.response(keep_body), False)
    assert read(data.draw(cuts(message.wire), label="pieces"), keep_body) == whole
    assert read([message.wire], keep_body, keep_headers=False) == (replace(whole[0], headers=[]), False)


# -- 2. oracles --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(messages(lenient=frozenset(("lf-head", "fold", "1xx-in-1.0"))))
def test_h11_reads_a_generated_response_as_the_reader_does(message: Message) -> None:
    ours, _ = read([message.wire])
    theirs = by_h11(message.wire)
    assert theirs.interims == list(message.interims)
    assert (theirs.status, theirs.reason.decode("latin-1"), theirs.minor) == (ours.status, ours.reason, ours.minor)
    assert normalized(theirs.headers) == normalized(ours.headers)
    assert (theirs.body, len(theirs.body)) == (bytes(ours.body), ours.body_bytes)
    if message.framing != "close":  # else the connection is gone anyway
        # h11 never keeps an HTTP/1.0 connection alive, even with Connection: keep-alive
        assert theirs.keep_alive == (ours.keep_alive and ours.minor == 1)


@settings(max_examples=300, deadline=None)
@given(messages())
def test_llhttp_reads_a_generated_response_as_the_reader_does(message: Message) -> None:
    ours, _ = read([message.wire])
    theirs = by_llhttp(message.wire)
    assert theirs.interims == list(message.interims)
    assert (theirs.status, theirs.reason.decode("latin-1"), theirs.minor) == (ours.status, ours.reason, ours.minor)
    assert theirs.headers == [(n.encode("latin-1"), v.encode("latin-1")) for n, v in ours.headers]
    assert (theirs.body, len(theirs.body)) == (bytes(ours.body), ours.body_bytes)
    if message.minor == 1 or not message.transfer_encoded:  # else llhttp keeps what RFC 9112 closes
        assert theirs.keep_alive == ours.keep_alive
    assert theirs.complete == (message.framing != "close")  # llhttp cannot end a body at the close


# -- deliberate leniencies, by example -------------------------------------------------------

LENIENT = {
    "header name with spaces": (
        b"HTTP/1.1 200 OK\r\nSpaces In Name: x\r\nContent-Length: 2\r\n\r\nok",
        [("Spaces In Name", "x"), ("Content-Length", "2")],
        ("llhttp", "h11"),
    ),
    "space before the colon": (
        b"HTTP/1.1 200 OK\r\nX-Name : x\r\nContent-Length: 2\r\n\r\nok",
        [("X-Name", "x"), ("Content-Length", "2")],
        ("llhttp", "h11"),
    ),
    "bare LF line ends": (
        b"HTTP/1.1 200 OK\nX-Name: x\nContent-Length: 2\n\nok",
        [("X-Name", "x"), ("Content-Length", "2")],
        ("llhttp",),
    ),
    "bare LF on chunk lines": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\n0\n\n",
        [("Transfer-Encoding", "chunked")],
        ("llhttp", "h11"),
    ),
    "obs-fold": (
        b"HTTP/1.1 200 OK\r\nX-Name: a\r\n \t b\r\nContent-Length: 2\r\n\r\nok",
        [("X-Name", "a b"), ("Content-Length", "2")],
        ("llhttp",),
    ),
    "blank line before the status line": (
        b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        [("Content-Length", "2")],
        ("h11",),
    ),
}


@pytest.mark.parametrize(("wire", "headers", "refused_by"), LENIENT.values(), ids=LENIENT.keys())
def test_the_reader_accepts_what_curl_accepts_where_h11_or_llhttp_refuse_it(
    wire: bytes, headers: list[tuple[str, str]], refused_by: tuple[str, ...]
) -> None:
    ours, extra = read([wire])
    assert (ours.status, ours.headers, bytes(ours.body), ours.keep_alive, extra) == (200, headers, b"ok", True, False)
    assert read([wire[i : i + 1] for i in range(len(wire))]) == (ours, False)
    for name, parse in (("h11", by_h11), ("llhttp", by_llhttp)):
        if name in refused_by:
            with pytest.raises((h11.RemoteProtocolError, httptools.HttpParserError)):
                parse(wire)
        else:
            theirs = parse(wire)
            assert (theirs.status, normalized(theirs.headers), theirs.body) == (200, normalized(headers), b"ok")


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
STRICT = {
    "space before the colon of Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
    "tab before the colon of Transfer-Encoding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n",
    "folded Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length:\r\n 2\r\n\r\nok",
    "fold before any header": b"HTTP/1.1 200 OK\r\n X: y\r\nContent-Length: 2\r\n\r\nok",
    "Content-Length and chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    "conflicting Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    "unasked-for 101": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    "Content-Length in hex": b"HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\nok",
    "chunked twice": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "chunk size not hex": CHUNKED + b"zz\r\nok\r\n0\r\n\r\n",
    "chunk size of 16 digits": CHUNKED + b"0000000000000002\r\nok\r\n0\r\n\r\n",
    "chunk longer than its size": CHUNKED + b"2\r\nokX\r\n0\r\n\r\n",
    "CR and more after a chunk": CHUNKED + b"2\r\nok\rX0\r\n\r\n",
    "HTTP/2 status line": b"HTTP/2 200\r\nContent-Length: 2\r\n\r\nok",
}


@pytest.mark.parametrize("wire", STRICT.values(), ids=STRICT.keys())
def test_the_reader_refuses_what_would_make_the_framing_a_guess(wire: bytes) -> None:
    assert outcome([wire], KEEP_ALL).kind == "refused"
    assert outcome([wire[i : i + 1] for i in range(len(wire))], KEEP_ALL).kind == "refused"


def test_http10_keep_alive_is_honoured_as_llhttp_does_and_h11_does_not() -> None:
    wire = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"
    assert read([wire])[0].keep_alive and by_llhttp(wire).keep_alive and not by_h11(wire).keep_alive
    both = b"HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok"
    assert not read([both])[0].keep_alive and by_llhttp(both).keep_alive  # close wins here, not in llhttp


HTTP10_TRANSFER_ENCODED = {
    "chunked": b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "204 with chunked": b"HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
    "an empty Transfer-Encoding": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding:\r\nContent-Length: 2\r\n\r\nok"
    ),
}


@pytest.mark.parametrize("wire", HTTP10_TRANSFER_ENCODED.values(), ids=HTTP10_TRANSFER_ENCODED.keys())
def test_an_http10_response_with_transfer_encoding_closes_the_connection_even_with_keep_alive(wire: bytes) -> None:
    """RFC 9112 section 6.1: Transfer-Encoding came with HTTP/1.1, so on HTTP/1.0 it is likely
    forwarded by something that did not apply it; the framing may be faulty, and the connection
    MUST be closed after the response. llhttp keeps it open."""
    ours, extra = read([wire])
    assert (ours.keep_alive, extra) == (False, False)
    assert bytes(ours.body) == (b"" if ours.status == 204 else b"ok")


# -- 3. attribution ----------------------------------------------------------------------

#: bytes that look like HTTP, to build answers that are almost responses
FRAGMENTS = (
    b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 204 No Content\r\n", b"HTTP/1.1 304 \r\n", b"HTTP/1.1 100 Continue\r\n",
    b"HTTP/1.1 103 Early Hints\r\n", b"HTTP/1.1 101 Switching Protocols\r\n", b"HTTP/1.1 500\r\n",
    b"HTTP/2 200\r\n", b"HTTP/1.1 2000 X\r\n", b"HTTP/1.1 099 X\r\n", b"HTTP/1.1  200  OK\n", b"http/1.1 200 OK\r\n",
    b"\r\n", b"\r\n", b"\n", b"\r", b"\r\n\r\n", b"\n\n", b" ", b"\t", b":", b";", b",", b"0", b"7",
    b"Content-Length: 0\r\n", b"Content-Length: 5\r\n", b"Content-Length: 5, 5\r\n", b"Content-Length: 5,\r\n",
    b"Content-Length: -1\r\n", b"Content-Length: 99999999999999999999\r\n", b"Content-Length: 0x10\r\n",
    b"Content-Length : 3\r\n", b"Content-Length:\r\n 3\r\n", b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n", b"Transfer-Encoding: chunked, chunked\r\n", b"Transfer-Encoding: gzip, chunked\r\n",
    b"Transfer-Encoding:\r\n", b"Connection: close\r\n", b"Connection: keep-alive\r\n", b" folded\r\n",
    b"X-Name: value\r\n", b"Spaces In Name: x\r\n", b"no colon\r\n", b"0\r\n", b"5\r\n", b"5;ext=1\r\n",
    b"ffffffffffffffff\r\n", b"fffffffffffffff\r\n", b"0\r\n\r\n", b"0\r\nX: y\r\n\r\n", b"hello", b"\x00", b"\xff",
)  # fmt: skip
huge = st.builds(
    lambda size, byte: byte * size, st.integers(4_000, 140_000), st.sampled_from((b"a", b"0", b"\r", b"\n"))
)
http_ish = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=8), st.integers(0, 1 << 70).map(lambda n: b"%d" % n),
              st.integers(0, 1 << 70).map(lambda n: b"%x" % n), messages(lenient=LENIENCIES).map(lambda m: m.wire)),
    max_size=24,
).map(b"".join)  # fmt: skip
huge_http_ish = st.lists(st.one_of(st.sampled_from(FRAGMENTS), huge), min_size=1, max_size=6).map(b"".join)
#: how long reading any bytes (up to ~300 KiB, fed twice) may take: milliseconds are the norm,
#: so this catches a loop or quadratic work, not a busy machine
NEVER_HANGS = timedelta(seconds=5)
anything = st.one_of(st.binary(max_size=600), http_ish, messages(lenient=LENIENCIES).map(lambda m: m.wire))


@settings(max_examples=200, deadline=None)
@given(st.data(), messages(lenient=LENIENCIES, framings=("length", "chunked")), anything, st.sampled_from(KEEP_BODIES))
def test_a_response_followed_by_any_bytes_reads_as_it_does_alone_and_flags_the_rest(
    data: st.DataObject, message: Message, after: bytes, keep_body: int
) -> None:
    alone, extra = read([message.wire], keep_body)
    assert not extra
    assert read(data.draw(cuts(message.wire + after), label="pieces"), keep_body) == (alone, bool(after))


@settings(max_examples=300, deadline=NEVER_HANGS, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.one_of(st.binary(max_size=2000), http_ish), st.sampled_from(KEEP_BODIES))
def test_any_bytes_end_in_a_response_a_refusal_or_truncation_the_same_however_split(
    data: st.DataObject, wire: bytes, keep_body: int
) -> None:
    whole = outcome([wire], keep_body)
    assert outcome(data.draw(cuts(wire), label="pieces"), keep_body) == whole


@settings(max_examples=60, deadline=NEVER_HANGS, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), huge_http_ish)
def test_huge_http_like_bytes_end_the_same_however_split_and_stay_bounded(data: st.DataObject, wire: bytes) -> None:
    whole = outcome([wire], 64)
    assert outcome(data.draw(cuts(wire), label="pieces"), 64) == whole


def padded(start: bytes, size: int, eol: bytes) -> bytes:
    """``start`` and a header line padded to ``size`` bytes in all, ending in ``eol``."""
    return start + b"X-Pad: " + b"a" * (size - len(start) - len(b"X-Pad: ") - len(eol)) + eol


HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
#: a head or trailers of exactly MAX_HEAD_BYTES (before the blank line), and one byte more
AT_THE_LIMIT = {
    "head of the limit": (padded(HEAD, MAX_HEAD_BYTES, b"\r\n") + b"\r\n", "response"),
    "head of the limit, bare LF": (padded(HEAD, MAX_HEAD_BYTES, b"\n") + b"\n", "response"),
    "head over the limit": (padded(HEAD, MAX_HEAD_BYTES + 1, b"\r\n") + b"\r\n", "refused"),
    "trailers of the limit": (CHUNKED + b"0\r\n" + padded(b"", MAX_HEAD_BYTES, b"\r\n") + b"\r\n", "response"),
    "trailers over the limit": (CHUNKED + b"0\r\n" + padded(b"", MAX_HEAD_BYTES + 1, b"\r\n") + b"\r\n", "refused"),
}


@pytest.mark.parametrize(("wire", "kind"), AT_THE_LIMIT.values(), ids=AT_THE_LIMIT.keys())
def test_a_head_or_trailers_at_the_size_limit_end_the_same_however_split(wire: bytes, kind: str) -> None:
    whole = outcome([wire], 64)
    assert whole.kind == kind
    for at in (len(wire) - 1, len(wire) - 2, len(wire) - 3, MAX_HEAD_BYTES, MAX_HEAD_BYTES + 1):
        assert outcome([wire[:at], wire[at:]], 64) == whole, at


# -- 4. attribution through the real client ----------------------------------------------

SECOND = b"HTTP/1.1 %d Second\r\nContent-Length: 0\r\n\r\n" % SECOND_STATUS
#: between the writes the first answer is played in: long enough for the client to read each
PAUSE = 0.002
#: after the first answer is all written, before the second request: the client reads what is left
SETTLE = 0.01


@dataclass
class _Scene:
    """One example: the answer to the first request, in the writes it is played in, and whether
    the server closes the connection after it."""

    writes: list[bytes]
    close_first: bool
    requests: int = 0
    played: asyncio.Event = field(default_factory=asyncio.Event)


class _FirstThenSecond:
    """A raw server on 127.0.0.1: the first request gets ``scene.writes``, every later one (on
    whichever connection it comes) gets SECOND."""

    def __init__(self) -> None:
        self.scene = _Scene([], close_first=True)
        self.transports: list[asyncio.Transport] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def protocol(self) -> asyncio.Protocol:
        server = self

        class Connection(asyncio.Protocol):
            def __init__(self) -> None:
                self.buf = bytearray()

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport: asyncio.Transport = transport  # type: ignore[assignment]
                server.transports.append(self.transport)

            def data_received(self, data: bytes) -> None:
                self.buf += data
                while _take_request(self.buf):
                    scene = server.scene
                    scene.requests += 1
                    if scene.requests > 1:
                        self.transport.write(SECOND)
                        continue
                    task = asyncio.get_running_loop().create_task(self.play(scene))
                    server.tasks.add(task)
                    task.add_done_callback(server.tasks.discard)

            async def play(self, scene: _Scene) -> None:
                try:
                    for n, piece in enumerate(scene.writes):
                        if n:
                            await asyncio.sleep(PAUSE)
                        if self.transport.is_closing():  # the client hung up
                            return
                        self.transport.write(piece)
                    if scene.close_first:
                        self.transport.close()
                finally:
                    scene.played.set()

        return Connection()

    def hang_up(self) -> None:
        for transport in self.transports:
            transport.close()
        self.transports.clear()


def _take_request(buf: bytearray) -> bool:
    """Takes one whole request (head and Content-Length body) off ``buf``, if it is there."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in bytes(buf[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if len(buf) < end + 4 + length:
        return False
    del buf[: end + 4 + length]
    return True


async def _two_requests(server: _FirstThenSecond, url: str) -> HttpResult:
    """The second request's result. It goes out once the first answer is all written and read:
    bytes still on their way then would be taken as its answer by any HTTP/1.1 client, since
    nothing in HTTP/1.1 ties an answer to its request but the order."""
    sender = FastSender(pool_size=2)
    try:
        await sender.send(url, b"{}", {}, timeout=0.3, connect_timeout=1)
        await asyncio.wait_for(server.scene.played.wait(), 2)
        await asyncio.sleep(SETTLE)
        return await sender.send(url, b"{}", {}, timeout=2, connect_timeout=1)
    finally:
        await sender.close()
        server.hang_up()
        await asyncio.sleep(0)


@st.composite
def scenes(draw: st.DrawFn) -> _Scene:
    """A first answer in the writes it is played in: either a response the connection survives
    in one write and more bytes (responses, garbage) in the next ones, or any bytes cut
    anywhere, most often followed by a close (else garbage that never ends waits for the
    timeout)."""
    if draw(st.booleans()):
        reusable = draw(messages(lenient=LENIENCIES).filter(lambda m: m.keep_alive))
        more = st.one_of(messages(lenient=LENIENCIES).map(lambda m: m.wire), anything).filter(bool)
        return _Scene([reusable.wire, *draw(st.lists(more, min_size=1, max_size=2))], draw(st.booleans()))
    answer = draw(st.one_of(anything, st.lists(messages(lenient=LENIENCIES), min_size=2, max_size=3).map(
        lambda ms: b"".join(m.wire for m in ms))))  # fmt: skip
    points = sorted(draw(st.lists(st.integers(0, len(answer)), max_size=3)))
    writes = [answer[a:b] for a, b in zip([0, *points], [*points, len(answer)], strict=True)]
    return _Scene(writes, close_first=draw(st.integers(0, 3)) > 0)


def test_through_the_real_client_the_second_request_gets_its_own_answer_whatever_answered_the_first() -> None:
    loop = uvloop.new_event_loop()
    server = _FirstThenSecond()
    listening = cast(asyncio.Server, loop.run_until_complete(loop.create_server(server.protocol, "127.0.0.1", 0)))
    url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/hook"
    try:

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(scenes())
        def second_request(scene: _Scene) -> None:
            server.scene = scene
            second = loop.run_until_complete(_two_requests(server, url))
            assert (second.status, second.error_class) == (SECOND_STATUS, None), second
            assert scene.requests >= 2

        second_request()
    finally:
        listening.close()
        loop.run_until_complete(listening.wait_closed())
        loop.close()
