"""The webhook HTTP sender against real misbehaving servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from datetime import timedelta

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgferry.delivery import fasthttp
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import parse_retry_after
from pgferry.delivery.retry import judge
from pgferry.receiver import CutBody, Drop, Garbage, Hang, Receiver, Respond
from tests.helpers import NOW, MakeReceiver, subscription


@pytest.fixture
async def sender() -> FastSender:
    return FastSender(pool_size=4)


async def post(sender: FastSender, url: str, timeout: float = 2.0):  # type: ignore[no-untyped-def]
    return await sender.send(url, b'{"a": 1}', {"content-type": "application/json"}, timeout=timeout, connect_timeout=1)


async def test_success_reuses_connections(sender: FastSender, receiver_factory: MakeReceiver) -> None:
    receiver, url = await receiver_factory()
    results = await asyncio.gather(*(post(sender, url) for _ in range(50)))
    assert all(r.ok and r.status == 200 for r in results)
    assert receiver.stats.connections <= 4  # the pool bound
    got = receiver.received[0]
    assert got.method == "POST" and got.path == "/hook" and got.body == b'{"a": 1}'
    assert got.headers["host"] == f"127.0.0.1:{receiver.port}" and got.headers["content-type"] == "application/json"


async def test_an_ipv6_literal_keeps_its_brackets_in_the_host_header(sender: FastSender) -> None:
    """nginx answered 400 to "Host: ::1:56279", and the events were dead-lettered (outside probe)."""
    receiver = Receiver(lambda _: Respond())
    await receiver.start(host="::1")
    try:
        assert (await post(sender, f"http://[::1]:{receiver.port}/hook")).status == 200
    finally:
        await receiver.stop()
    assert receiver.received[0].headers["host"] == f"[::1]:{receiver.port}"
    assert fasthttp._target("GET", "http://[::1]/x")[1].endswith("\r\nHost: [::1]")
    refused = await post(sender, "http://[::1]:1/hook")  # and in what the attempt says
    assert refused.error_class == "connect" and "cannot connect to [::1]:1" in (refused.error or ""), refused
    assert fasthttp._target("GET", "https://bücher.example/x")[1].endswith("\r\nHost: xn--bcher-kva.example")


async def test_failures_are_classified(sender: FastSender, receiver_factory: MakeReceiver) -> None:
    cases: list[tuple[object, str, str]] = [
        (Respond(500, b"boom"), "http_status", "HTTP 500 Internal Server Error"),
        (Respond(302, b"", (("Location", "http://elsewhere/"),)), "redirect", "redirect to http://elsewhere/"),
        (Drop(), "empty_reply", "without a complete response"),
        (Garbage(), "invalid_response", "invalid HTTP response"),
        (CutBody(), "reset", "cut off"),
        (Hang(), "timeout", "no complete answer within 0.3 s"),
    ]
    for action, error_class, text in cases:
        _, url = await receiver_factory(lambda _, a=action: a)
        result = await post(sender, url, timeout=0.3)
        assert (result.error_class, text in (result.error or "")) == (error_class, True), result
    _, url = await receiver_factory(lambda _: Respond(429, b"slow", (("Retry-After", "7"),)))
    throttled = await post(sender, url)
    assert (throttled.status, throttled.retry_after, throttled.response) == (429, 7.0, "slow")


async def test_refused_and_unresolvable(sender: FastSender) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    refused = await post(sender, f"http://127.0.0.1:{port}/x")
    assert refused.error_class == "connect" and "cannot connect to 127.0.0.1" in (refused.error or "")
    unknown = await post(sender, "http://no-such-host.invalid/x")
    assert unknown.error_class == "dns" and "cannot resolve host 'no-such-host.invalid'" in (unknown.error or "")


async def test_a_kept_alive_connection_closed_by_the_server_is_replaced(
    sender: FastSender, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    assert (await post(sender, url)).ok
    for transport in list(receiver.stats.open):  # the server drops its idle connections
        transport.close()
    await asyncio.sleep(0.05)
    assert (await post(sender, url)).ok
    assert receiver.stats.connections == 2


async def test_connections_a_burst_opened_are_closed_once_idle_past_their_time(
    sender: FastSender, receiver_factory: MakeReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fasthttp, "IDLE_LIMIT", 0.3)
    receiver, url = await receiver_factory()  # never closes an idle connection itself
    assert all(r.ok for r in await asyncio.gather(*(post(sender, url) for _ in range(4))))
    assert len(receiver.stats.open) == 4
    for _ in range(8):  # one request at a time: the most recent connection serves them all
        assert (await post(sender, url)).ok
        await asyncio.sleep(0.1)
    assert len(receiver.stats.open) == 1
    assert receiver.stats.connections == 4


async def test_a_sender_keeps_at_most_max_idle_connections_over_all_endpoints(
    receiver_factory: MakeReceiver,
) -> None:
    sender = FastSender(pool_size=4, max_idle=3)
    receivers = [await receiver_factory() for _ in range(3)]
    for _ in range(2):  # a burst of two requests to each of three endpoints: six connections
        results = await asyncio.gather(*(post(sender, url) for _, url in receivers for _ in range(2)))
        assert all(r.ok for r in results)
    await asyncio.sleep(0.05)
    assert sum(len(r.stats.open) for r, _ in receivers) == 3  # those given back beyond three closed
    for _, url in receivers:
        assert (await post(sender, url)).ok
    await sender.close()


async def test_a_busy_endpoint_keeps_its_connection_when_quiet_ones_fill_the_idle_bound(
    receiver_factory: MakeReceiver,
) -> None:
    """The connection idle longest goes, not the one just given back: closing that one made every
    request of a busy endpoint open a new connection (66,231 for 100,000 requests, bench fanout)."""
    sender = FastSender(pool_size=4, max_idle=3)
    (quiet, quiet_url), (busy, busy_url) = await receiver_factory(), await receiver_factory()
    assert all(r.ok for r in await asyncio.gather(*(post(sender, quiet_url) for _ in range(3))))
    for _ in range(5):
        assert (await post(sender, busy_url)).ok
    await asyncio.sleep(0.05)
    assert busy.stats.connections == 1 and len(busy.stats.open) == 1
    assert len(quiet.stats.open) == 2  # its longest idle one closed to keep the busy one
    await sender.close()


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/x", "http://[fd00:ec2::254]/"]
)
async def test_metadata_and_link_local_addresses_are_refused_without_connecting(sender: FastSender, url: str) -> None:
    result = await post(sender, url)
    assert result.error_class == "refused_address" and "cloud-metadata" in (result.error or "")


async def test_pg_net_requests_are_refused_them_too(sender: FastSender) -> None:
    result = await sender.request(
        "GET", "http://169.254.169.254/latest/meta-data/", None, {}, timeout=2, connect_timeout=1, capture=True
    )
    assert result.error_class == "refused_address", result


async def test_subscribe_refuses_metadata_ip_literals(conn: asyncpg.Connection) -> None:
    for url in ("http://169.254.169.254/latest", "http://[fe80::1]:8080/x"):
        with pytest.raises(asyncpg.PostgresError, match="link-local or cloud-metadata address"):
            await conn.execute("select ferry.subscribe('x', array['s'], $1)", url)
    await conn.execute("select ferry.subscribe('ok', array['s'], 'http://127.0.0.1:9/x')")  # loopback stays allowed


async def test_the_late_answer_to_a_cancelled_request_is_never_read_as_the_next_ones(sender: FastSender) -> None:
    """A paused subscription's request is cancelled; its 200 came later on the kept-alive connection
    and was recorded as another subscription's delivery (the server had answered that one 500)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length"))  # fmt: skip
            body = await reader.readexactly(length)
            if body == b"slow":
                await asyncio.sleep(0.5)
            status = b"200 OK" if body == b"slow" else b"500 Internal Server Error"
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    one = FastSender(pool_size=1)  # one connection: the next request would take the same one
    try:
        slow = asyncio.create_task(one.send(url, b"slow", {}, timeout=5, connect_timeout=1))
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        answer = await one.send(url, b"next", {}, timeout=5, connect_timeout=1)
        assert answer.status == 500, answer
    finally:
        await one.close()
        server.close()


class AnswersTwice:
    """A server that answers each request 500, then 200 again 30 ms later on the same connection."""

    def __init__(self) -> None:
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the sender closed it
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length"))  # fmt: skip
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                await asyncio.sleep(0.03)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")  # the stray second answer

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def __aexit__(self, *_: object) -> None:
        self.server.close()


async def test_an_endpoint_that_answers_twice_gets_a_new_connection_for_each_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second answer that comes after the next request was written is read as that one's (HTTP/1.1
    cannot tell): a receiver answering 500, then 200 again 30 ms later, had 7 of 10 rejected events
    recorded as delivered (outside probe). Once an endpoint sent bytes nobody asked for, its
    connections are closed after each answer, so no late answer has a request to be taken for."""
    twice = AnswersTwice()
    one = FastSender(pool_size=1)
    async with twice as url:
        try:
            with caplog.at_level("WARNING", logger="pgferry.delivery.fasthttp"):
                assert (await one.send(url, b"1", {}, timeout=5, connect_timeout=1)).status == 500
                await asyncio.sleep(0.1)  # the stray answer comes while the connection is idle
                for n in range(2, 6):  # back to back: a kept-alive connection would take the stray 200
                    assert (await one.send(url, str(n).encode(), {}, timeout=5, connect_timeout=1)).status == 500
            assert twice.connections == 5
            assert "no request asked for" in caplog.text and "not reused for 600 s" in caplog.text
        finally:
            await one.close()


async def test_a_request_saying_connection_close_never_shares_its_connection() -> None:
    """Under steady traffic the stray answer is never caught on an idle connection, so the guard
    above never starts, and 4-8 of 40 rejected events were recorded as delivered (outside probe).
    A subscription whose headers say Connection: close gets a new connection for every request."""
    twice = AnswersTwice()
    one = FastSender(pool_size=1)
    async with twice as url:
        try:
            for n in range(8):  # back to back from the first request
                result = await one.send(url, str(n).encode(), {"Connection": "close"}, timeout=5, connect_timeout=1)
                assert result.status == 500, n
            assert twice.connections == 8
        finally:
            await one.close()


@pytest.mark.parametrize(
    ("head", "status", "says"),
    [
        (b"HTTP/1.1 500 Bad\0Thing\r\n", 500, "HTTP 500 Bad Thing"),
        (b"HTTP/1.1 302 Found\r\nlocation: /x\0y\r\n", 302, "redirect to /x y"),
        (b"HTTP/1.1 410 Gone\r\ncontent-type: text/plain; charset=undefined\r\n", 410, "HTTP 410 Gone"),
        (
            b"HTTP/1.1 503 Busy\r\ncontent-type: text/plain; charset=idna\r\nretry-after: 100000000000000\r\n",
            503,
            "503",
        ),
    ],
)
async def test_answers_whose_text_postgresql_or_python_cannot_take_are_still_recorded(
    sender: FastSender, head: bytes, status: int, says: str
) -> None:
    """A NUL in the reason or Location made the attempt unrecordable (the worker failed and sent
    again, forever); charset=undefined or idna made decoding raise, losing the status (a 410 no
    longer disabled the subscription); a huge Retry-After overflowed the retry time."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + b"content-length: 4\r\n\r\nn\0pe")
        await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        result = await post(sender, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook")
    finally:
        server.close()
    assert result.status == status and says in (result.error or ""), result
    assert "\0" not in (result.error or "") + (result.response or "")
    sub = subscription(max_attempts=3)
    verdict = judge(sub, result, 1, NOW, NOW)
    assert not verdict.dead and verdict.next_attempt_at is not None
    assert verdict.next_attempt_at - NOW <= timedelta(hours=6)


async def test_a_retry_after_that_is_not_ascii_digits_is_ignored_not_raised(sender: FastSender) -> None:
    """ "Retry-After: ²" (the byte 0xB2, read as Latin-1) passed str.isdigit and failed float()
    inside the sender: each request was recorded as a pgferry internal error (outside probe)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: \xb2\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        result = await post(sender, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x")
    finally:
        server.close()
    assert (result.status, result.error_class, result.retry_after) == (503, "http_status", None)


@given(st.text(st.characters(max_codepoint=0xFF)))  # a header is read as Latin-1
def test_parse_retry_after_never_raises(value: str) -> None:
    seconds = parse_retry_after(value, now=0.0)
    assert seconds is None or seconds >= 0
