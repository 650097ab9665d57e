"""The webhook sender against answers no polite server gives, played byte for byte by a
scripted server on 127.0.0.1: interim responses, two answers to one request, bodies ended
by closing, odd framing, huge or odd headers, stalls and garbage.

Every case sends two requests on one sender to one host:port. The first asks for a status
(``/answer/500``) and gets the case's odd answer; the second asks for 201 and must get
exactly that, so an answer left over from the first request cannot pass unnoticed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from pgferry.delivery.fasthttp import FastSender
from tests.delivery.conformance.scripted import (
    CONTINUE,
    EARLY_HINTS,
    Close,
    MakeScripted,
    Pause,
    Request,
    Step,
    answer,
    body_for,
    full,
    requested_status,
    status_line,
)
from tests.delivery.conformance.servers import post

#: how a case answers a request that asked for a status
Answer = Callable[[int], Sequence[Step]]

KIB = 1024


def plain(status: int) -> Sequence[Step]:
    return [full(status)]


def interim_first(*interims: bytes, pause: float = 0.02) -> Answer:
    """Each interim response in its own write, then the final answer."""
    return lambda status: [*(s for i in interims for s in (i, Pause(pause))), *plain(status)]


def close_delimited(version: str, *headers: str) -> Answer:
    """No Content-Length, no chunking: the body ends when the server closes."""
    head = "".join(f"{h}\r\n" for h in ("Content-Type: text/plain", *headers)).encode()
    return lambda status: [status_line(status, version) + head + b"\r\n" + body_for(status), Close()]


def chunked_with_extensions_and_trailers(status: int) -> Sequence[Step]:
    body = body_for(status)
    return [
        status_line(status) + b"Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"2;name=value\r\n" + body[:2] + b"\r\n"
        b"2;flag\r\n" + body[2:] + b"\r\n"
        b"0\r\nX-Checksum: abc\r\n\r\n"
    ]


def in_writes(size: int, pause: float) -> Callable[[bytes], list[Step]]:
    """Split an answer into writes of ``size`` bytes with ``pause`` between them."""
    return lambda data: [s for i in range(0, len(data), size) for s in (data[i : i + size], Pause(pause))]


def big_headers(status: int, *, one: bool) -> bytes:
    """An answer with 64 KiB of header values: in one header, or in 1024 of 64 bytes each
    (75 KiB on the wire with names and line ends; the sender must refuse only past 256 KiB)."""
    if one:
        return answer(status, body_for(status), "X-Big: " + "a" * (64 * KIB))
    return answer(status, body_for(status), *(f"X-H{n:04}: {'a' * 64}" for n in range(1024)))


@dataclass(frozen=True)
class Case:
    first: Answer  # how the server answers the first request
    status: int | None  # the result the first request must get
    error_class: str | None
    response: str | None = None  # the result's body snippet, when checked
    error: str | None = None  # a pattern the result's error text must match
    asks: int = 500  # the status the first request asks for
    rest: Answer = plain  # how the server answers every later request
    reuse: bool | None = None  # whether the second request must (not) come on the first one's connection
    timeout: float = 2.0
    gap: float = 0.0  # seconds between the two requests


CASES = {
    # interim (1xx) responses come before the real answer, which is the result
    "100-continue-then-500": Case(interim_first(CONTINUE), 500, "http_status", "boom", rest=interim_first(CONTINUE)),
    "100-continue-then-200": Case(interim_first(CONTINUE), 200, None, asks=200, rest=interim_first(CONTINUE)),
    "100-continue-and-500-in-one-write": Case(
        lambda s: [CONTINUE + full(s)], 500, "http_status", "boom", rest=lambda s: [CONTINUE + full(s)]
    ),
    "103-early-hints-then-500": Case(
        interim_first(EARLY_HINTS), 500, "http_status", "boom", rest=interim_first(EARLY_HINTS)
    ),
    "100-and-103-then-500": Case(
        interim_first(CONTINUE, EARLY_HINTS), 500, "http_status", "boom", rest=interim_first(CONTINUE, EARLY_HINTS)
    ),
    # a request gets the first answer; whatever else came makes the connection unusable
    "two-answers-in-one-write": Case(lambda s: [full(s) + full(200)], 500, "http_status", "boom", reuse=False),
    "unsolicited-answer-on-the-idle-connection": Case(
        lambda s: [*plain(s), Pause(0.05), *plain(500)], 200, None, asks=200, reuse=False, gap=0.2
    ),
    "101-switching-protocols-unasked": Case(
        lambda _: [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"],
        None,
        "invalid_response",
        reuse=False,
    ),
    # bodies ended by closing the connection
    "http10-200-ended-by-close": Case(close_delimited("HTTP/1.0"), 200, None, asks=200),
    "http10-500-ended-by-close": Case(close_delimited("HTTP/1.0"), 500, "http_status", "boom"),
    "http11-connection-close-200-without-length": Case(
        close_delimited("HTTP/1.1", "Connection: close"), 200, None, asks=200
    ),
    "http11-connection-close-500-without-length": Case(
        close_delimited("HTTP/1.1", "Connection: close"), 500, "http_status", "boom"
    ),
    # chunk extensions and trailers
    "chunked-500-with-extensions-and-trailers": Case(chunked_with_extensions_and_trailers, 500, "http_status", "boom"),
    "chunked-200-with-extensions-and-trailers": Case(chunked_with_extensions_and_trailers, 200, None, asks=200),
    # answers that never have a body
    "204-without-body": Case(lambda _: [b"HTTP/1.1 204 No Content\r\n\r\n"], 204, None, asks=204, reuse=True),
    "304-without-body": Case(
        lambda _: [b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'], 304, "http_status", asks=304, reuse=True
    ),
    # header blocks: big, odd, or trickled in
    "64-KiB-in-one-header": Case(lambda s: [big_headers(s, one=True)], 500, "http_status", "boom"),
    "64-KiB-in-1024-headers-in-8-KiB-writes": Case(
        lambda s: in_writes(8 * KIB, 0.002)(big_headers(s, one=False)), 500, "http_status", "boom"
    ),
    "header-block-over-256-KiB": Case(
        lambda s: [status_line(s) + b"X-Big: " + b"a" * (300 * KIB), Pause(30)],
        None,
        "invalid_response",
        error=r"(?i)header.*(too long|longer than)",
        reuse=False,
    ),
    "header-name-with-spaces": Case(
        lambda s: [answer(s, body_for(s), "Spaces In Header Name: x")], 200, None, asks=200
    ),
    "bare-LF-line-endings": Case(lambda _: [b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"], 200, None, asks=200),
    "status-line-one-byte-a-write": Case(
        lambda s: [*in_writes(1, 0.002)(status_line(s)), full(s)[len(status_line(s)) :]],
        500,
        "http_status",
        "boom",
    ),
    # stalls, garbage and broken framing
    "stall-mid-body": Case(
        lambda s: [status_line(s) + b"Content-Length: 10\r\n\r\nboo", Pause(30)],
        None,
        "timeout",
        timeout=0.3,
        reuse=False,
    ),
    "garbage": Case(lambda _: [b"not http at all\r\n\r\n"], None, "invalid_response", reuse=False),
    "four-digit-status": Case(
        lambda _: [b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok"], None, "invalid_response", reuse=False
    ),
    "http2-status-line": Case(
        lambda _: [b"HTTP/2 200\r\nContent-Length: 2\r\n\r\nok"], None, "invalid_response", reuse=False
    ),
    "content-length-and-chunked": Case(
        lambda s: [status_line(s) + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nboom\r\n0\r\n\r\n"],
        None,
        "invalid_response",
        reuse=False,
    ),
    "content-length-longer-than-the-body": Case(
        lambda s: [status_line(s) + b"Content-Length: 100\r\n\r\nboom", Close()], None, "reset", error="cut off"
    ),
    "close-without-answering": Case(lambda _: [Close()], None, "empty_reply"),
    "idle-connection-closed-by-the-server": Case(
        lambda s: [*plain(s), Pause(0.05), Close()],
        200,
        None,
        asks=200,
        rest=lambda s: [*plain(s), Pause(0.05), Close()],
        gap=0.2,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_an_odd_answer_gets_the_result_the_server_meant_and_the_next_request_gets_its_own_answer(
    sender: FastSender, scripted: MakeScripted, case: Case
) -> None:
    def script(request: Request) -> Sequence[Step]:
        how = case.first if request is server.requests[0] else case.rest
        return how(requested_status(request))

    server = await scripted(script)
    first = await post(sender, server.url(f"/answer/{case.asks}"), timeout=case.timeout)
    await asyncio.sleep(case.gap)
    second = await post(sender, server.url("/answer/201"))
    both = f"first request got {first}; second got {second}"  # both, to tell misattribution apart

    assert (first.status, first.error_class) == (case.status, case.error_class), both
    if case.response is not None:
        assert first.response == case.response, both
    if case.error is not None:
        assert re.search(case.error, first.error or ""), both
    if case.error_class == "timeout":
        assert first.latency_ms < case.timeout * 1000 + 200, both
    assert (second.status, second.error_class) == (201, None), both
    if case.reuse is not None:
        on = server.requests[0].connection, server.requests[-1].connection
        assert (on[0] == on[1]) == case.reuse, f"connections {on}: reuse expected {case.reuse}"
