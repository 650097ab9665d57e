"""Who may use the streams API: bearer tokens scoped by stream patterns and read/write (real
``TokenStore`` over the database), loopback only when allowed, CORS for the listed origins."""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg

import pgferry
from pgferry import api_tokens
from tests.helpers import StartApi, TokensDown
from tests.streams.sse import SseEvent, sse_events


async def test_tokens_decide_who_reads_and_writes_which_stream(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    reader = await api_tokens.create(conn, "browser", read=["chat:*"], write=[])
    writer = await api_tokens.create(conn, "producer", read=[], write=["chat:*", "jobs:?"])
    api = await start_api()  # allow_loopback off: loopback needs a token too
    await ferry.publish("chat:1", {"n": 1})
    base = f"{api.base}/v1/streams"

    async with aiohttp.ClientSession() as session:

        async def status(method: str, path: str, token: str | None = None, **kwargs: object) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.request(method, base + path, headers=headers, **kwargs) as r:  # type: ignore[arg-type]
                if r.status in (401, 403):
                    assert r.headers["WWW-Authenticate"].startswith('Bearer realm="pgferry"')
                    assert (await r.json())["error"]
                return r.status

        assert await status("GET", "/chat:1/events") == 401  # no token
        assert await status("GET", "/chat:1/events", "pft_" + "x" * 43) == 401  # unknown
        assert await status("GET", "/chat:1/events", "not-even-a-token") == 401
        assert await status("GET", "/chat:1/events", reader) == 200
        assert await status("GET", "/other:1/events", reader) == 403  # right token, other stream
        assert await status("POST", "/chat:1", reader, json={"payload": 1}) == 403  # read-only
        assert await status("POST", "/chat:1", writer, json={"payload": 2}) == 201
        assert await status("POST", "/jobs:7", writer, json={"payload": 2}) == 201
        assert await status("POST", "/jobs:77", writer, json={"payload": 2}) == 403
        assert await status("GET", "/chat:1/events", writer) == 403  # write-only
        assert await status("POST", "/chat:9/close", writer) == 200
        # EventSource cannot send headers: ?access_token= works for reading.
        async with session.get(f"{base}/chat:1?access_token={reader}") as r:
            assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        async with session.get(f"{base}/chat:1?access_token=pft_{'y' * 43}") as r:
            assert r.status == 401
        # Revoked: refused within the store's refresh interval (5 s).
        await api_tokens.revoke(conn, "browser")
        deadline = asyncio.get_running_loop().time() + 10
        while await status("GET", "/chat:1/events", reader) == 200:
            assert asyncio.get_running_loop().time() < deadline, "a revoked token still works"
            await asyncio.sleep(0.2)
        assert await status("GET", "/chat:1/events", reader) == 401


async def test_loopback_goes_without_a_token_only_when_allowed(start_api: StartApi, ferry: pgferry.Ferry) -> None:
    api = await start_api(allow_loopback=True)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{api.base}/v1/streams/a/events") as r:
            assert r.status == 200
        async with session.post(f"{api.base}/v1/streams/a", json={"payload": 1}) as r:
            assert r.status == 201


async def test_cors_answers_listed_origins_only(start_api: StartApi, conn: asyncpg.Connection) -> None:
    token = await api_tokens.create(conn, "web", read=["*"], write=["*"])
    api = await start_api(cors_origins=("https://app.example.com",))
    url = f"{api.base}/v1/streams/chat:1/events"
    async with aiohttp.ClientSession() as session:
        preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
        async with session.options(f"{api.base}/v1/streams/chat:1", headers=preflight) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        # A fetch-based SSE reader sends Cache-Control: it was refused at the preflight (outside probe).
        asked = "accept, authorization, cache-control, last-event-id"
        sse_preflight = {**preflight, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": asked}
        async with session.options(f"{api.base}/v1/streams/chat:1", headers=sse_preflight) as r:
            allowed = {h.strip().lower() for h in r.headers["Access-Control-Allow-Headers"].split(",")}
            assert r.status == 204 and {"accept", "authorization", "cache-control", "last-event-id"} <= allowed
        auth = {"Authorization": f"Bearer {token}"}
        async with session.get(url, headers={"Origin": "https://app.example.com", **auth}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
            assert r.headers["Vary"] == "Origin"
        async with session.get(url, headers={"Origin": "https://app.example.com"}) as r:
            # errors carry the CORS headers too, so the page can read why, and its challenge
            assert r.status == 401 and r.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
            exposed = {h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")}
            assert exposed == {"www-authenticate", "retry-after"} and "WWW-Authenticate" in r.headers
        async with session.get(url, headers={"Origin": "https://evil.example.net", **auth}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with session.options(url, headers={**preflight, "Origin": "https://evil.example.net"}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with session.get(f"{api.base}/v1/streams/chat:1?access_token={token}",
                               headers={"Origin": "https://app.example.com"}) as r:  # fmt: skip
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example.com"


async def test_a_token_revoked_while_its_stream_is_open_ends_that_stream(
    start_api: StartApi, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    token = await api_tokens.create(conn, "revoked-live", read=["live:*"], write=[])
    api = await start_api(heartbeat=0.5)
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.get(f"{api.base}/v1/streams/live:1", headers=headers) as r:
            assert r.status == 200
            events = sse_events(r)
            await ferry.publish("live:1", {"n": 1})
            first = await asyncio.wait_for(anext(events), 10)
            assert first.event == "message"
            await api_tokens.revoke(conn, "revoked-live")

            async def until_error() -> SseEvent:
                n = 1
                async for event in events:
                    if event.event == "error":
                        return event
                    n += 1
                    await ferry.publish("live:1", {"n": n})
                raise AssertionError("the stream ended without an error event")

            await ferry.publish("live:1", {"n": 2})
            ended = await asyncio.wait_for(until_error(), 15)
            assert "no longer valid (revoked)" in ended.data, ended.data
            assert await r.content.read() == b""  # and the response ends


async def test_a_write_token_over_a_captured_tables_stream_cannot_post_into_it(
    start_api: StartApi, conn: asyncpg.Connection
) -> None:
    """Events posted there would look like the table's own changes to every subscriber."""
    writer = await api_tokens.create(conn, "public-writer", read=[], write=["public.*"])
    await conn.execute("create table orders (id int primary key)")
    await conn.execute("select ferry.capture_table('orders')")
    api = await start_api()
    headers = {"Authorization": f"Bearer {writer}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(f"{api.base}/v1/streams/public.orders", json={"payload": {"id": 1}}) as r:
            assert r.status == 409, await r.text()
            assert "written by the capture of table public.orders" in (await r.json())["error"]
        async with session.post(f"{api.base}/v1/streams/public.orders/close") as r:
            assert r.status == 409 and "captured table" in (await r.json())["error"]
        async with session.post(f"{api.base}/v1/streams/public.notes", json={"payload": 1}) as r:
            assert r.status == 201  # the same token, a stream no capture writes
        await conn.execute("select ferry.uncapture_table('orders')")
        async with session.post(f"{api.base}/v1/streams/public.orders", json={"payload": {"id": 2}}) as r:
            assert r.status == 201  # the capture has stopped
    assert await conn.fetchval("select count(*) from ferry.events where stream = 'public.orders'") == 1


async def test_a_failure_that_passes_tells_an_sse_client_to_reconnect_and_a_long_poll_to_retry(
    start_api: StartApi, conn: asyncpg.Connection
) -> None:
    """An EventSource stops for good on any answer but 200: the database down a moment (the tokens
    cannot be loaded) or the readers' limit lost a page its stream for good (outside probe). SSE
    gets 200, ``retry:`` and why; the long-poll keeps its 503 with Retry-After; 401 stays final."""
    token = await api_tokens.create(conn, "reader", read=["chat:*"], write=[])
    api = await start_api(max_clients=1)
    tokens = TokensDown(api)
    headers = {"Authorization": f"Bearer {token}"}
    sse, poll = f"{api.base}/v1/streams/chat:1", f"{api.base}/v1/streams/chat:1/events"

    async def reconnect_answer(session: aiohttp.ClientSession) -> tuple[str, int]:
        async with session.get(sse, headers=headers) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream", await r.text()
            comment, retry, blank, end = (await asyncio.wait_for(r.content.read(), 5)).decode().split("\n")
            assert retry.startswith("retry: ") and blank == end == "", (comment, retry)
            return comment, int(retry.removeprefix("retry: "))

    async with aiohttp.ClientSession() as session:
        comment, retry = await reconnect_answer(session)
        assert comment == ": 503 cannot load the API tokens: [Errno 111] Connection refused; try again shortly"
        assert 2000 <= retry <= 4000
        async with session.get(poll, headers=headers) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "2" and "API tokens" in (await r.json())["error"]
        tokens.down = False
        async with session.get(sse, headers=headers) as held:  # the relay's one reader
            assert (await held.content.readuntil(b"\n\n")) == b"retry: 2000\n\n"
            comment, retry = await reconnect_answer(session)
            assert comment == ": 503 this relay serves 1 readers at most; try again shortly", comment
            assert 1000 <= retry <= 2000
            async with session.get(poll, headers=headers) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
        async with session.get(sse) as r:  # final answers stay what they are
            assert r.status == 401
        async with session.get(f"{api.base}/v1/streams/other", headers=headers) as r:
            assert r.status == 403
