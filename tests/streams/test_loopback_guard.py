"""`--api-allow-loopback` lets in requests without a token only from pages no other site can
make a browser send: to a loopback Host name (a DNS-rebinding page read every stream), and for
writes with a JSON Content-Type and no foreign Origin (a page anywhere published and closed
streams with text/plain and form posts; outside probe). Real HTTP against a real relay."""

from __future__ import annotations

import aiohttp
import asyncpg

import pgferry
from pgferry import api_tokens
from tests.helpers import StartApi

APP = "https://app.example.com"
EVIL = "https://evil.example"


async def test_anonymous_loopback_requests_need_a_loopback_host_and_writes_need_json_from_a_listed_origin(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    api = await start_api(allow_loopback=True, cors_origins=(APP,))
    await ferry.publish("private:secret", {"n": 1})
    base = f"{api.base}/v1/streams"
    port = api.base.rsplit(":", 1)[1]

    async with aiohttp.ClientSession() as session:
        # DNS rebinding: the page's own name in Host. Asked for a token; nothing read.
        async with session.get(f"{base}/private:secret/events", headers={"Host": f"attacker.example:{port}"}) as r:
            assert r.status == 401 and "events" not in await r.json()
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            async with session.get(f"{base}/private:secret/events?wait=10", headers={"Host": host}) as r:
                assert r.status == 200 and len((await r.json())["events"]) == 1

        async def post(path: str, body: bytes, content_type: str, origin: str | None = None) -> int:
            headers = {"Content-Type": content_type, **({"Origin": origin} if origin else {})}
            async with session.post(base + path, data=body, headers=headers) as r:
                return r.status

        forged = b'{"payload": {"forged": true}}'
        assert await post("/private:secret", forged, "text/plain;charset=UTF-8", EVIL) == 415
        assert await post("/private:secret", forged, "text/plain") == 415  # a form's type, whatever the Origin
        assert await post("/private:secret", forged, "application/json", EVIL) == 403
        assert await post("/private:secret", b"x", "application/x-www-form-urlencoded", EVIL) == 415
        assert await post("/victim/close", b"x", "application/x-www-form-urlencoded", EVIL) == 415
        assert await post("/victim/close", b"", "application/json", EVIL) == 403
        assert await post("/victim/close", b"", "application/json", "null") == 403  # a sandboxed frame
        assert await conn.fetchval("select count(*) from ferry.events where stream = 'private:secret'") == 1
        assert await conn.fetchval("select count(*) from ferry.closed_streams") == 0

        # What a local program (no Origin) and the listed origin's pages do still works.
        assert await post("/private:secret", b'{"payload": 2}', "application/json") == 201
        assert await post("/private:secret", b'{"payload": 3}', "application/json; charset=utf-8", APP) == 201
        assert await post("/victim/close", b"", "application/json") == 200

        # A token works under any Host name (the check is on what needs none).
        reader = await api_tokens.create(conn, "reader", read=["private:*"], write=[])
        async with session.get(
            f"{base}/private:secret/events?wait=10",
            headers={"Host": f"relay.example:{port}", "Authorization": f"Bearer {reader}"},
        ) as r:
            assert r.status == 200 and (await r.json())["events"]
