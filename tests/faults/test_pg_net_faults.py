"""The pg_net-compatible API against misbehaving receivers: each request ends with the error_msg
pg_net would record (libcurl's words, checked with curl 7.88 against the same answers), and the
relay carries on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import asyncpg

from pgferry.embedded import free_port
from pgferry.receiver import CutBody, Drop, Garbage, Hang
from tests.delivery.conformance.scripted import Close, Request, Reset, ScriptedServer, Step
from tests.helpers import MakeReceiver, RunningRelay, net_responses, redirect_to_self
from tests.pg_net.conftest import net_conn, net_db, net_relay  # noqa: F401 - fixtures

#: Raw answers, and what libcurl says of each (curl's exit code in brackets).
SCRIPTED = {
    # a length that is not a number (8)
    "bad Content-Length": (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nab", "Weird server reply"),
    # a chunk size that is not hex (56)
    "bad chunk size": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        "Failure when receiving data from the peer",
    ),
    # a status line of another protocol (1: libcurl reads it as HTTP/0.9, which it refuses)
    "HTTP/1.2": (b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n", "Unsupported protocol"),
    # cut inside the status line (52)
    "closing in the status line": (b"HTTP/1.1 20", "Server returned nothing (no headers, no data)"),
}


def answering(*steps: Step) -> Callable[[Request], Sequence[Step]]:
    """A script: the same steps for every request."""
    return lambda _: steps


async def test_pg_net_requests_to_misbehaving_receivers_end_with_libcurl_s_error_texts(
    net_relay: RunningRelay,  # noqa: F811
    net_conn: asyncpg.Connection,  # noqa: F811
    receiver_factory: MakeReceiver,
) -> None:
    """Garbage once read "Weird server reply" (libcurl: "Unsupported protocol") and a close after
    the headers "Failure when receiving data from the peer" (libcurl: "Transferred a partial file")."""
    await net_conn.execute("update ferry.subscriptions set max_attempts = 1 where name = 'pg_net'")  # pg_net's way
    await asyncio.sleep(0.5)  # the relay picks up new settings on its next round (every 0.2 s here)
    looping, loop_url = await receiver_factory(redirect_to_self)
    _, garbage = await receiver_factory(lambda _: Garbage())
    _, headers_only = await receiver_factory(lambda _: CutBody(body_bytes=0))
    _, half_body = await receiver_factory(lambda _: CutBody(body_bytes=100))
    _, dropping = await receiver_factory(lambda _: Drop())
    _, hanging = await receiver_factory(lambda _: Hang())
    healthy, ok_url = await receiver_factory()
    servers = {case: ScriptedServer(answering(answer, Close())) for case, (answer, _) in SCRIPTED.items()}
    servers["reset after the headers"] = ScriptedServer(
        answering(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nab", Reset())
    )
    for server in servers.values():
        await server.start()
    try:
        ids = {
            "redirect loop": await net_conn.fetchval("select net.http_get($1)", loop_url),
            "garbage": await net_conn.fetchval("select net.http_get($1)", garbage),
            "closing after the headers": await net_conn.fetchval("select net.http_get($1)", headers_only),
            "closing mid-body": await net_conn.fetchval("select net.http_get($1)", half_body),
            "closing without an answer": await net_conn.fetchval("select net.http_get($1)", dropping),
            "refused": await net_conn.fetchval("select net.http_get($1)", f"http://127.0.0.1:{free_port()}/"),
            "hanging": await net_conn.fetchval("select net.http_get($1, timeout_milliseconds := 300)", hanging),
        }
        for case, server in servers.items():
            ids[case] = await net_conn.fetchval("select net.http_post($1)", server.url("/x"))
        rows = {r["id"]: r for r in await net_responses(net_conn, len(ids))}
    finally:
        for server in servers.values():
            await server.stop()
    errors = {case: rows[i]["error_msg"] for case, i in ids.items()}
    assert errors.pop("hanging").startswith("Timeout of 300 ms reached. Total time: ")
    assert errors == {
        "redirect loop": "Number of redirects hit maximum amount",
        "garbage": "Unsupported protocol",
        "closing after the headers": "Transferred a partial file",
        "closing mid-body": "Transferred a partial file",
        "closing without an answer": "Server returned nothing (no headers, no data)",
        "refused": "Couldn't connect to server",
        **{case: text for case, (_, text) in SCRIPTED.items()},
        "reset after the headers": "Failure when receiving data from the peer",
    }
    assert looping.stats.requests == 31  # libcurl's limit, then it stops
    assert all(rows[i]["status_code"] is None for i in ids.values())
    # ... and the relay is still delivering.
    after = await net_conn.fetchval("select net.http_get($1)", ok_url)
    rows = {r["id"]: r for r in await net_responses(net_conn, len(ids) + 1)}
    assert rows[after]["status_code"] == 200 and len(healthy.received) == 1
