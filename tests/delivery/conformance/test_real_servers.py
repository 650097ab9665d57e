"""The webhook sender against real HTTP servers on 127.0.0.1: nginx, uvicorn (h11), aiohttp.web
and Python's http.server speaking HTTP/1.0 (bodies ended by closing the connection)."""

from __future__ import annotations

import asyncio

import pytest

from pgferry.delivery.fasthttp import FastSender
from tests.delivery.conformance.servers import Node, RealServer, post
from tests.helpers import eventually

KEEP_ALIVE_SERVERS = ["nginx", "uvicorn_h11", "aiohttp_web", "node"]


@pytest.fixture
def server(request: pytest.FixtureRequest) -> RealServer:
    """The server fixture named by the test's ``server`` parameter."""
    named: RealServer = request.getfixturevalue(request.param)
    return named


@pytest.mark.parametrize("server", KEEP_ALIVE_SERVERS, indirect=True)
async def test_twenty_plain_200s_are_ok_and_share_at_most_two_kept_alive_connections(
    sender: FastSender, server: RealServer
) -> None:
    before = len(server.connections())
    for _ in range(20):
        result = await post(sender, server.url("/ok"))
        assert (result.ok, result.status) == (True, 200), result

    async def all_seen() -> bool:  # nginx logs a request just after answering it
        return len(server.connections()) >= before + 20

    await eventually(all_seen, timeout=5, what="20 requests seen by the server")
    used = set(server.connections()[before:])
    assert len(used) <= 2, f"20 requests took {len(used)} connections"


ANSWERS = [
    ("nginx", "/ok", 200, None, None),
    ("nginx", "/fail", 500, "http_status", "boom"),
    ("nginx", "/gone", 410, "http_status", None),  # nginx's own HTML error page
    ("nginx", "/redirect", 302, "redirect", None),
    ("nginx", "/nocontent", 204, None, None),
    *[
        (name, path, status, error_class, response)
        for name in ("uvicorn_h11", "aiohttp_web", "node")
        for path, status, error_class, response in [
            ("/ok", 200, None, None),
            ("/fail", 500, "http_status", "boom"),
            ("/ok-chunked", 200, None, None),
            ("/fail-chunked", 500, "http_status", "boom"),
        ]
    ],
    ("http10", "/ok", 200, None, None),
    ("http10", "/fail", 500, "http_status", "boom"),
]


@pytest.mark.parametrize(
    ("server", "path", "status", "error_class", "response"),
    ANSWERS,
    indirect=["server"],
    ids=[f"{name}{path}" for name, path, *_ in ANSWERS],
)
async def test_a_real_server_s_answer_gets_the_status_and_body_it_sent_and_the_next_request_is_ok(
    sender: FastSender, server: RealServer, path: str, status: int, error_class: str | None, response: str | None
) -> None:
    result = await post(sender, server.url(path))
    assert (result.status, result.error_class) == (status, error_class), result
    if response is not None:
        assert result.response == response, result
    following = await post(sender, server.url("/ok"))
    assert (following.ok, following.status) == (True, 200), following


async def test_a_connection_is_not_reused_past_the_idle_timeout_the_server_announced(
    sender: FastSender, node: Node
) -> None:
    """Node closes an idle kept-alive connection after its keepAliveTimeout (here 1 s) and says
    so (Keep-Alive: timeout=1). A request written just as it closes would be lost and sent
    again; the client does not reuse such a connection past the announced timeout, less a margin."""
    first = await post(sender, node.url("/ok"))
    await asyncio.sleep(0.2)
    again = await post(sender, node.url("/ok"))  # well inside the timeout: the same connection
    await asyncio.sleep(1.1)  # past it: a new connection, no lost request, no second try
    late = await post(sender, node.url("/ok"))
    assert [r.ok and not r.earlier for r in (first, again, late)] == [True, True, True], (first, again, late)
    used = node.connections()[-3:]
    assert used[0] == used[1] != used[2], used
