"""The streams API from a real browser: Chromium's own EventSource, on a page of another origin,
follows a stream written by SQL across two restarts of the relay process and stops at its end."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp import web

from pgferry import Offset, api_tokens
from pgferry.embedded import free_port
from pgferry.streams import api as streams_api
from tests.helpers import CHROMIUM, CHROMIUM_ARGS, StartApi, TokensDown, cli, eventually, pgferry_env

STREAM = "chat:room-1"

#: The app's page: follows ?stream= on the API at ?api= with ?token= (as ?access_token=: an
#: EventSource cannot send an Authorization header), and records what it gets.
PAGE = """<!doctype html>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>chat</title>
<script>
const q = new URLSearchParams(location.search);
window.got = []; window.opens = 0; window.errors = 0; window.ended = null;
const es = window.es = new EventSource(q.get("api") + "/v1/streams/" + encodeURIComponent(q.get("stream"))
                                       + "?access_token=" + encodeURIComponent(q.get("token")));
es.onopen = () => { window.opens += 1; };
es.onerror = () => { window.errors += 1; };
es.onmessage = (e) => { window.got.push({id: e.lastEventId, data: e.data}); };
es.addEventListener("end", (e) => {
  es.close();
  window.ended = {id: e.lastEventId, state: es.readyState};
});
</script>
"""


class RelayProcess:
    """`pgferry run --api-port PORT` as a process of its own, stopped and started again on the same port."""

    def __init__(self, cmd: list[str], url: str, origin: str, log: Path) -> None:
        port = free_port()
        self.args = [*cmd, "run", "--database-url", url, "--api-port", str(port), "--api-cors-origin", origin]
        self.url, self.base, self.log = url, f"http://127.0.0.1:{port}", log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=pgferry_env(self.url)
            )

        async def serving() -> bool:
            assert self.proc is not None and self.proc.returncode is None, self.log.read_text()
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{self.base}/v1/streams/{STREAM}/events") as r:
                    return r.status == 401  # the API answers, and wants a token
            except aiohttp.ClientConnectionError:
                return False

        await eventually(serving, timeout=15, what="the relay's streams API")

    async def stop(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), 20)
        took = time.monotonic() - started
        assert code == (0 if sig == signal.SIGTERM else -sig), self.log.read_text()
        assert took < 5, f"the relay took {took:.1f} s to exit on {sig.name}"

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@pytest.fixture
async def origins() -> AsyncIterator[tuple[str, str]]:
    """The app's page served on two loopback ports, so from two origins: (listed, not listed)."""
    app = web.Application()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    served = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        served.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
    yield served[0], served[1]
    await runner.cleanup()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it as root)")
async def test_chromium_eventsource_follows_a_stream_across_relay_restarts_to_its_end_and_cors_holds(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, origins: tuple[str, str], tmp_path: Path
) -> None:
    from playwright.async_api import Response, async_playwright

    app_origin, foreign_origin = origins
    made = await cli(pgferry_cmd, db_url, "token", "create", "chat-page", "--read", "chat:*")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    relay = RelayProcess(pgferry_cmd, db_url, app_origin, tmp_path / "relay.log")
    published: list[dict[str, Any]] = []

    async def publish(n: int) -> None:
        for _ in range(n):
            payload = {"n": len(published), "text": f"message {len(published)}"}
            await conn.fetchval("select ferry.publish($1, $2)", STREAM, payload)
            published.append(payload)

    query = f"/?api={relay.base}&stream={STREAM}&token={token}"
    await publish(3)  # history, before anyone reads
    await relay.start()
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await browser.new_page()
                #: (Origin, Last-Event-ID) of each request of the page's EventSource the relay answered
                requests: list[tuple[str | None, str | None]] = []

                async def answered(response: Response) -> None:
                    if response.url.startswith(relay.base):
                        headers = await response.request.all_headers()
                        requests.append((headers.get("origin"), headers.get("last-event-id")))

                page.on("response", answered)

                async def state() -> dict[str, Any]:
                    return await page.evaluate(  # type: ignore[no-any-return]
                        "({got: window.got, opens: window.opens, errors: window.errors, ended: window.ended,"
                        " readyState: window.es.readyState})"
                    )

                def received_all(what: str) -> Awaitable[None]:
                    async def check() -> bool:
                        return len((await state())["got"]) >= len(published)

                    return eventually(check, what=what)

                await page.goto(app_origin + query)
                await received_all("the history in the page")
                await publish(2)
                await received_all("live events in the page")

                # The same page from an origin the relay does not list: the browser withholds the stream.
                foreign = await browser.new_page()
                console: list[str] = []
                foreign.on("console", lambda message: console.append(message.text))
                await foreign.goto(foreign_origin + query)

                async def refused() -> bool:
                    return bool(await foreign.evaluate("window.es.readyState === EventSource.CLOSED"))

                await eventually(refused, what="the browser to refuse the foreign page the stream")
                assert await foreign.evaluate("[window.got.length, window.opens, window.errors]") == [0, 0, 1]
                assert any("blocked by CORS policy: No 'Access-Control-Allow-Origin'" in m for m in console), console
                await foreign.close()

                # The relay restarts twice, stopped by SIGTERM then killed, with events published while it is down.
                resumed_from = []
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    before = await state()
                    resumed_from.append(before["got"][-1]["id"])
                    await relay.stop(sig)

                    async def dropped(errors: int = before["errors"]) -> bool:
                        return bool((await state())["errors"] > errors)

                    await eventually(dropped, what=f"the page to see the connection drop ({sig.name})")
                    await publish(2)
                    await relay.start()
                    await received_all(f"the events published while the relay was down ({sig.name})")
                    await publish(2)
                    await received_all(f"live events after the restart ({sig.name})")
                    assert (await state())["opens"] == before["opens"] + 1

                await conn.fetchval("select ferry.close_stream($1)", STREAM)

                async def ended() -> bool:
                    return (await state())["ended"] is not None

                await eventually(ended, what="the end event in the page")
                final = await state()
            finally:
                await browser.close()
        await relay.stop(signal.SIGTERM)
    finally:
        await relay.kill()

    events = [orjson.loads(e["data"]) for e in final["got"]]
    assert [e["payload"] for e in events] == published  # no gap, no duplicate, in order
    assert all(e["stream"] == STREAM for e in events)
    offsets = [Offset.parse(e["id"]) for e in final["got"]]
    assert [e["offset"] for e in events] == [e["id"] for e in final["got"]]
    assert offsets == sorted(set(offsets))
    assert Offset.parse(final["ended"]["id"]) > offsets[-1]
    assert final["ended"]["state"] == final["readyState"] == 2  # CLOSED, by the page's end handler
    assert final["opens"] == 3
    # CORS requests from the listed origin; each reconnect resumed from the last event the page had.
    assert {origin for origin, _ in requests} == {app_origin}
    assert [last for _, last in requests] == [None, *resumed_from]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it as root)")
async def test_chromium_eventsource_rides_out_the_database_down_and_the_readers_limit(
    start_api: StartApi, conn: asyncpg.Connection, origins: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A browser's EventSource stops for good on any answer but 200, and the relay answered 503
    while the API tokens could not be loaded (the database down) and to readers past its limit: a
    page lost its stream for good (outside probe). Now it reconnects until it is served."""
    from playwright.async_api import async_playwright

    monkeypatch.setattr(streams_api, "TRANSIENT_RETRY", 1)  # reconnects within 1-2 s
    app_origin, _ = origins
    token = await api_tokens.create(conn, "chat-page", read=["chat:*"], write=[])
    api = await start_api(cors_origins=(app_origin,), max_clients=1)
    tokens = TokensDown(api)

    async def publish(n: int) -> None:
        await conn.fetchval("select ferry.publish($1, $2)", STREAM, {"n": n})

    await publish(0)
    async with async_playwright() as pw, aiohttp.ClientSession() as session:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = await browser.new_page()

            async def state() -> dict[str, Any]:
                return await page.evaluate(  # type: ignore[no-any-return]
                    "({got: window.got.map((e) => JSON.parse(e.data).payload.n), opens: window.opens,"
                    " errors: window.errors, readyState: window.es.readyState})"
                )

            async def answered(n: int) -> bool:
                now = await state()
                assert now["readyState"] != 2, now  # CLOSED: the page would have lost its stream
                return bool(now["errors"] >= n)

            await page.goto(f"{app_origin}/?api={api.base}&stream={STREAM}&token={token}")
            await eventually(lambda: answered(2), what="two answers while the tokens cannot be loaded")
            tokens.down = False
            while True:  # one reader takes the relay's only place (before the page's next reconnect)
                held = await session.get(f"{api.base}/v1/streams/{STREAM}?access_token={token}")
                if await held.content.readuntil(b"\n\n") == b"retry: 2000\n\n":
                    break
                held.close()
            try:
                before = (await state())["errors"]
                await publish(1)
                await eventually(lambda: answered(before + 2), what="two answers at the readers' limit")
                assert (await state())["got"] == []
            finally:
                held.close()

            async def got(n: int) -> bool:
                return bool(len((await state())["got"]) >= n)

            await eventually(lambda: got(2), what="the stream once the relay serves the page")
            await publish(2)
            await eventually(lambda: got(3), what="live events")
            final = await state()
        finally:
            await browser.close()
    assert final["got"] == [0, 1, 2] and final["readyState"] == 1, final
