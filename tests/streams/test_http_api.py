"""The streams HTTP API over real sockets: SSE with resume and end, long-poll, publishing, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
import yarl

import pgferry
from pgferry import db
from tests.helpers import StartApi, eventually
from tests.streams.sse import SseEvent, sse_events

#: what a publish or close without a token says it sends (``--api-allow-loopback`` requires it)
JSON = {"Content-Type": "application/json"}


async def read_sse(session: aiohttp.ClientSession, url: str, n: int | None = None, timeout: float = 10,
                   **kwargs: Any) -> list[SseEvent]:  # fmt: skip
    """The events of an SSE response until its end (or ``n`` of them)."""
    got: list[SseEvent] = []
    async with asyncio.timeout(timeout), session.get(url, **kwargs) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "text/event-stream"
        async for event in sse_events(response):
            got.append(event)
            if len(got) == n:
                break
    return got


async def read_sse_as_eventsource(session: aiohttp.ClientSession, url: str, timeout: float) -> list[SseEvent]:
    """The stream's events until its end, reconnecting after an ``error`` event with the last id
    received, as an EventSource does (a reader the relay let go as too slow, on a starved machine)."""
    got: list[SseEvent] = []
    async with asyncio.timeout(timeout):
        while True:
            last = next((e.id for e in reversed(got) if e.id), None)
            batch = await read_sse(session, url, timeout=timeout, headers={"Last-Event-ID": last} if last else {})
            got += [e for e in batch if e.event != "error"]
            if batch and batch[-1].event == "error":
                assert "reconnect" in orjson.loads(batch[-1].data)["reason"], batch[-1].data
                continue
            return got


async def test_sse_gives_committed_events_in_commit_order_live_resumes_after_any_offset_and_ends(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    api = await start_api(allow_loopback=True)
    url = f"{api.base}/v1/streams/chat:1"
    slow = await db.connect(db_url)
    try:
        slow_tx = slow.transaction()
        await slow_tx.start()
        late = await ferry.publish("chat:1", {"n": "late"}, conn=slow)  # smaller id, commits last
        early = await ferry.publish("chat:1", {"n": "early"})
        async with conn.transaction():
            await ferry.publish("chat:2", {"n": "another stream"}, conn=conn)
        rolled_back = conn.transaction()
        await rolled_back.start()
        await ferry.publish("chat:1", {"n": "never"}, conn=conn)
        await rolled_back.rollback()
        await asyncio.sleep(0.1)  # a tick or more between the two commits
        await slow_tx.commit()
    finally:
        await slow.close()
    async with aiohttp.ClientSession() as session:
        reading = asyncio.create_task(read_sse(session, url))
        await asyncio.sleep(0.3)
        live = await ferry.publish("chat:1", {"n": "live"}, key="k")
        await asyncio.sleep(0.1)
        await ferry.close_stream("chat:1")
        got = await reading
        assert [e.event for e in got] == ["message", "message", "message", "end"]
        bodies = [orjson.loads(e.data) for e in got[:3]]
        assert [b["payload"]["n"] for b in bodies] == ["early", "late", "live"]
        assert [b["id"] for b in bodies] == [early, late, live] and bodies[2]["key"] == "k"
        assert [b["offset"] for b in bodies] == [e.id for e in got[:3]]
        assert all(b["stream"] == "chat:1" for b in bodies)

        # EventSource reconnects with Last-Event-ID: after the first event, exactly the rest.
        again = await read_sse(session, url, headers={"Last-Event-ID": got[0].id or ""})
        assert [e.id for e in again] == [e.id for e in got[1:]]
        resumed = await read_sse(session, f"{url}?after={got[1].id}")
        assert [e.id for e in resumed] == [e.id for e in got[2:]]
        # After the end: 204, which tells EventSource to stop reconnecting.
        async with session.get(url, headers={"Last-Event-ID": got[-1].id or ""}) as response:
            assert response.status == 204
        # The Python reader sees the same events at the same offsets.
        python = [e async for e in ferry.read_stream("chat:1", poll_interval=0.05)]
        assert [str(e.offset) for e in python] == [e.id for e in got[:3]]


async def test_many_clients_on_interleaved_streams_each_get_exactly_their_stream(
    start_api: StartApi, ferry: pgferry.Ferry, db_url: str
) -> None:
    api = await start_api(allow_loopback=True)
    streams = [f"job:{n}" for n in range(20)]
    async with aiohttp.ClientSession() as session:
        tasks = [(s, asyncio.create_task(read_sse(session, f"{api.base}/v1/streams/{s}", timeout=30)))
                 for s in streams for _ in range(3)]  # fmt: skip
        await asyncio.sleep(0.2)

        async def writer(number: int) -> dict[str, list[int]]:
            own = await db.connect(db_url)
            written: dict[str, list[int]] = {}
            try:
                for i in range(40):
                    stream = streams[(number * 7 + i) % len(streams)]
                    tx = own.transaction()
                    await tx.start()
                    event = await ferry.publish(stream, {"w": number, "i": i}, conn=own)
                    if i % 9 == 4:
                        await tx.rollback()
                    else:
                        await tx.commit()
                        written.setdefault(stream, []).append(event)
                    await asyncio.sleep(0.002)
            finally:
                await own.close()
            return written

        results = await asyncio.gather(*(writer(n) for n in range(4)))
        for stream in streams:
            await ferry.close_stream(stream)
        for stream, task in tasks:
            got = await task
            assert got[-1].event == "end", got[-1].data
            ids = [orjson.loads(e.data)["id"] for e in got[:-1]]
            expected = sorted(i for r in results for i in r.get(stream, []))
            assert sorted(ids) == expected and len(set(ids)) == len(ids), stream
            offsets = [pgferry.Offset.parse(e.id or "") for e in got]
            assert offsets == sorted(offsets)


async def test_long_poll_pages_waits_for_the_next_event_and_says_when_the_stream_is_closed(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    api = await start_api(allow_loopback=True)
    url = f"{api.base}/v1/streams/progress:9/events"
    ids = [e for e in await ferry.publish_many([{"stream": "progress:9", "payload": n} for n in range(5)])]
    async with aiohttp.ClientSession() as session:

        async def poll(**params: Any) -> dict[str, Any]:
            async with session.get(url, params={k: str(v) for k, v in params.items()}) as response:
                assert response.status == 200, await response.text()
                return orjson.loads(await response.read())  # type: ignore[no-any-return]

        await asyncio.sleep(0.2)
        first = await poll(limit=3)
        assert [e["id"] for e in first["events"]] == ids[:3] and not first["closed"]
        second = await poll(after=first["next"], limit=3)
        assert [e["id"] for e in second["events"]] == ids[3:]
        empty = await poll(after=second["next"])
        assert empty["events"] == [] and empty["next"]
        waiting = asyncio.create_task(poll(after=empty["next"], wait=10))
        await asyncio.sleep(0.3)
        started = asyncio.get_running_loop().time()
        later = await ferry.publish("progress:9", "done")
        woke = await waiting
        assert [e["id"] for e in woke["events"]] == [later]
        assert asyncio.get_running_loop().time() - started < 2  # answered when it came, not at wait's end
        quiet = await poll(after=woke["next"], wait=0.3)
        assert quiet["events"] == [] and not quiet["closed"]
        await ferry.close_stream("progress:9")
        await asyncio.sleep(0.2)
        closing = await poll(after=quiet["next"], wait=5)
        assert closing["events"] == [] and closing["closed"]
        assert (await poll(after=closing["next"]))["closed"]


async def test_publish_over_http_one_event_or_many_in_one_transaction(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    api = await start_api(allow_loopback=True)
    url = f"{api.base}/v1/streams/orders:7"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json={"payload": {"total": 5}, "key": "o7", "headers": {"source": "api"}}) as r:
            assert r.status == 201
            (one,) = (await r.json())["ids"]
        async with session.post(url, json=[{"payload": n} for n in range(3)]) as r:
            assert r.status == 201 and len((await r.json())["ids"]) == 3
        bad = {
            b"{not json": "not JSON",
            b"[]": "publish 1 to 1000 events",
            orjson.dumps([{"payload": 1}] * 1001): "publish 1 to 1000 events",
            b'{"data": 1}': "must be an object",
            b'[{"payload": 1}, {"payload": 2, "key": 5}]': "event #1: key must be a string",
            b'{"payload": 1, "headers": []}': "headers must be an object",
            b'{"payload": 1, "headers": {"n": 5}}': "headers must be an object of strings",
        }
        for body, message in bad.items():
            async with session.post(url, data=body, headers=JSON) as r:
                assert r.status == 400 and message in (await r.json())["error"], (body, await r.text())
        async with session.post(url, json={"payload": 1, "headers": {"pgferry-control": "end"}}) as r:
            assert r.status == 400 and "reserved" in (await r.json())["error"]
        async with session.post(f"{url}/close", headers=JSON) as r:
            assert r.status == 200 and (await r.json())["end"] > one
        async with session.post(url, json={"payload": 1}) as r:
            assert r.status == 409 and "closed" in (await r.json())["error"]
    row = await conn.fetchrow("select key, payload, headers from ferry.events where id = $1", one)
    assert (row["key"], row["payload"], row["headers"]) == (
        "o7", {"total": 5}, {"source": "api"})  # fmt: skip
    assert await conn.fetchval("select count(*) from ferry.events where stream = 'orders:7'") == 5  # with the end


async def test_head_answers_the_get_s_status_and_headers_with_no_body_and_takes_no_reader(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    """HEAD of the SSE route streamed the events as a body (no Transfer-Encoding) and held a
    reader until the client closed: 5 HEADs, 5 readers (outside probe). Raw sockets: one
    keep-alive connection takes HEADs, then a GET whose answer must be the next bytes."""
    api = await start_api(allow_loopback=True)
    await ferry.publish("s", {"n": 1})
    url = yarl.URL(api.base)
    reader, writer = await asyncio.open_connection(url.host, url.port)

    async def ask(method: str, path: str) -> tuple[str, dict[str, str]]:
        writer.write(f"{method} /v1/streams/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        async with asyncio.timeout(5):
            status, *lines = (await reader.readuntil(b"\r\n\r\n")).decode().strip().split("\r\n")
        return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}

    try:
        for path in ("s", "s/events?wait=10", "s?after=999999999-1", "s?after=bad", "s/events?limit=0"):
            status, headers = await ask("HEAD", path)
            expected = {"s": "200", "s/events?wait=10": "200"}.get(path, "400")
            assert status.split()[1] == expected, (path, status)
            if path == "s":
                assert headers["content-type"] == "text/event-stream" and headers["x-accel-buffering"] == "no"
            assert "transfer-encoding" not in headers, (path, headers)
            await ferry.publish("s", {"n": 2})
            assert api.relay.api is not None and api.relay.api.stats.clients == 0, path
        status, headers = await ask("GET", "s/events")  # what follows the HEADs is this answer, intact
        assert status == "HTTP/1.1 200 OK", status
        body = orjson.loads(await reader.readexactly(int(headers["content-length"])))
        assert set(body) == {"events", "next", "closed"}, body
    finally:
        writer.close()


async def test_published_numbers_reach_postgresql_with_all_their_digits(
    start_api: StartApi, conn: asyncpg.Connection
) -> None:
    """orjson read them as doubles, and they were stored rounded (outside probe): 30 digits as
    123456789012345680000000000000, 19.90 as 19.9; ``ferry.publish`` in SQL keeps them."""
    api = await start_api(allow_loopback=True)
    url = f"{api.base}/v1/streams/numbers"
    payloads = [
        '{"big":123456789012345678901234567890,"dec":0.10000000000000000000001,'
        '"neg":-18446744073709551616,"money":19.90}',
        "[1.500, 0.0, -0.000, 2.50e3, 1E-7, 18446744073709551615, 9223372036854775807]",
        "1e400",  # a double's infinity; a jsonb number like any other, as in SQL
        '{"n": 1, "s": "no float here"}',
    ]
    body = "[" + ",".join(f'{{"payload": {p}, "key": "k{i}"}}' for i, p in enumerate(payloads)) + "]"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=body, headers=JSON) as r:
            assert r.status == 201, await r.text()
            ids = (await r.json())["ids"]
        for bad in ('{"payload": NaN}', '{"payload": [1.5, "\\ud800"]}', '{"payload": 1.5, "key": 2.5}'):
            async with session.post(url, data=bad, headers=JSON) as r:
                assert r.status == 400, (bad, await r.text())
    stored = await conn.fetch("select payload::text from ferry.events where id = any($1) order by id", ids)
    expected = [await conn.fetchval("select $1::text::jsonb::text", p) for p in payloads]
    assert [row["payload"] for row in stored] == expected
    assert "123456789012345678901234567890" in expected[0] and "19.90" in expected[0] and "1.500" in expected[1]


@pytest.mark.parametrize("name", ["chat/42", "wiki:Zürich straße", "a b+c", "'; drop table x; --", "%00"])
async def test_odd_stream_names_are_addressable_percent_encoded(
    start_api: StartApi, ferry: pgferry.Ferry, name: str
) -> None:
    from urllib.parse import quote

    api = await start_api(allow_loopback=True)
    if name == "%00":
        async with aiohttp.ClientSession() as session, session.get(f"{api.base}/v1/streams/%00/events") as r:
            assert r.status == 400 and "control characters" in (await r.json())["error"]
        return
    event = await ferry.publish(name, {"n": 1})
    url = f"{api.base}/v1/streams/{quote(name, safe='')}"
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(0.2)
        async with session.get(yarl_url(url + "/events")) as r:
            body = await r.json()
            assert r.status == 200 and [e["id"] for e in body["events"]] == [event], body
            assert body["events"][0]["stream"] == name


def yarl_url(url: str) -> Any:
    import yarl

    return yarl.URL(url, encoded=True)


async def test_bad_requests_get_clear_errors_and_the_relay_keeps_serving(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    api = await start_api(allow_loopback=True, max_clients=3)
    base = f"{api.base}/v1/streams/s"
    cases = {
        "/events?after=yesterday": (400, "not a stream offset"),
        "/events?after=1-2-3": (400, "not a stream offset"),
        "/events?limit=1000000000": (400, "limit must be a whole number from 1 to 1000"),
        "/events?limit=-1": (400, "limit must be"),
        "/events?wait=nan": (400, "wait must be a number of seconds from 0 to 30"),
        "/events?wait=1e9": (400, "wait must be"),
        "/events?limit=%C2%B2": (400, "limit must be"),  # "²".isdigit(): a 500 and a traceback
        "/events?wait=%D9%A1": (400, "wait must be"),  # an Arabic-Indic 1
        "?after=99999999999999999999": (400, "not a stream offset"),
        "?after=999999999-1": (400, "is ahead of this database's log"),  # SSE: once waited, silently
        "/events?after=999999999-1": (400, "is ahead of this database's log"),
    }
    async with aiohttp.ClientSession() as session:
        for path, (status, message) in cases.items():
            async with session.get(base + path) as r:
                assert r.status == status and message in (await r.json())["error"], (path, await r.text())
        async with session.get(f"{api.base}/v1/streams/{'x' * 201}/events") as r:
            assert r.status == 400 and "1-200 characters" in (await r.json())["error"]
        async with session.delete(base + "/events") as r:  # aiohttp's own answers are JSON too
            assert r.status == 405 and "error" in await r.json() and "GET" in r.headers["Allow"]
        async with session.post(base, data=b"x" * (2 << 20), headers=JSON) as r:
            assert r.status == 413 and "exceeded" in (await r.json())["error"]
        for name in ("%FF", "a%ED%A0%80", "%C2%85"):  # not UTF-8 (kept as the text "%FF" before), a C1 control
            async with session.get(yarl.URL(f"{api.base}/v1/streams/{name}/events", encoded=True)) as r:
                assert r.status == 400 and "stream name" in (await r.json())["error"], (name, await r.text())
        for name in ("%ZZ", "a%2", "%"):  # served as the stream "%ZZ" before
            async with session.get(yarl.URL(f"{api.base}/v1/streams/{name}/events", encoded=True)) as r:
                assert r.status == 400 and "starts an escape" in (await r.json())["error"], (name, await r.text())
        for path in ("/v1/streams/", "/v1/streams/s/extra/path", "/v1/streams/s/other"):  # a 405 before
            async with session.get(yarl.URL(api.base + path, encoded=True)) as r:
                assert r.status == 404 and "no such endpoint" in (await r.json())["error"], (path, await r.text())
        async with session.delete(base) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, POST", await r.text()
        async with session.get(base + "/events", headers={"Last-Event-ID": "garbage"}) as r:
            assert r.status == 200  # Last-Event-ID counts for SSE only
        # More readers than max_clients: 503, and the ones in get served.
        held = [await session.get(base) for _ in range(3)]
        try:
            async with session.get(base + "/events") as r:
                assert r.status == 503 and "3 readers at most" in (await r.json())["error"]
        finally:
            for response in held:
                response.close()
        await asyncio.sleep(0.2)
        event = await ferry.publish("s", 1)
        async with session.get(base + "/events", params={"wait": "5"}) as r:
            assert r.status == 200 and [e["id"] for e in (await r.json())["events"]] == [event]


async def test_deeply_nested_events_are_served_and_published_like_any_other(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """orjson stops at 254 levels, jsonb at 6,400: an event 255 levels deep cut every SSE reader
    of its stream (which reconnected forever), answered the long-poll 500, and was refused on
    POST with a 500 (outside probe)."""
    api = await start_api(allow_loopback=True)
    deep = "[" * 300 + "]" * 300
    await ferry.publish("deep", {"a": 1})
    await conn.execute("select ferry.publish('deep', $1::jsonb)", deep)
    base = f"{api.base}/v1/streams/deep"
    async with aiohttp.ClientSession() as session:
        async with session.post(base, data=f'{{"payload": {deep}, "headers": {{"x": "y"}}}}', headers=JSON) as r:
            assert r.status == 201, await r.text()
        await ferry.publish("deep", {"a": 3})
        await conn.execute("select ferry.close_stream('deep')")
        got = await read_sse(session, base)
        assert [e.event for e in got] == ["message"] * 4 + ["end"]
        datas = [e.data for e in got[:4]]
        assert orjson.loads(datas[0])["payload"] == {"a": 1} and orjson.loads(datas[3])["payload"] == {"a": 3}
        assert deep in datas[1] and deep in datas[2]
        async with session.get(base + "/events") as r:
            assert r.status == 200
            body = await r.text()
            assert body.count(deep) == 2 and body.endswith('"closed":true}')
        # A body its Content-Encoding does not decode: 400, not 500.
        async with session.post(base.replace("deep", "other"), data=b'{"payload": 1}',
                                headers={**JSON, "Content-Encoding": "gzip"}) as r:  # fmt: skip
            assert r.status == 400 and "cannot be read" in (await r.json())["error"]


async def test_events_nested_past_python_s_stack_are_served_and_published_or_refused_clearly(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """The standard library's encoder, the fallback past orjson's 254 levels, ran out of Python's
    stack at about 900: a POST 990 levels deep answered 500, and an event with headers that deep
    made its stream's SSE readers reconnect into the same wall forever (outside probe)."""
    api = await start_api(allow_loopback=True)
    headers_990 = '{"a":' * 990 + '"x"' + "}" * 990
    headers_3000 = '{"a":' * 3000 + '"x"' + "}" * 3000  # past orjson's decoding too: RawJSON
    payload_990 = "[" * 990 + "1" + "]" * 990
    await conn.execute("select ferry.publish('deep', '{}', headers => $1::text::jsonb)", headers_990)
    await conn.execute("select ferry.publish('deep', '{}', headers => $1::text::jsonb)", headers_3000)
    base = f"{api.base}/v1/streams/deep"
    async with aiohttp.ClientSession() as session:
        async with session.post(base, data=f'{{"payload": {payload_990}}}', headers=JSON) as r:
            assert r.status == 201, await r.text()
        too_deep = "[" * 5000 + "]" * 5000
        async with session.post(base, data=f'{{"payload": {too_deep}}}', headers=JSON) as r:
            assert r.status == 400 and "nested deeper than this API reads" in (await r.json())["error"]
        await conn.execute("select ferry.close_stream('deep')")
        got = await read_sse(session, base)
        assert [e.event for e in got] == ["message"] * 3 + ["end"]
        datas = [e.data.replace(" ", "") for e in got]  # (PostgreSQL's text of jsonb has spaces)
        assert headers_990 in datas[0] and headers_3000 in datas[1] and payload_990 in datas[2]
        async with session.get(base + "/events") as r:
            assert r.status == 200
            body = (await r.text()).replace(" ", "")
            assert headers_990 in body and headers_3000 in body and payload_990 in body


async def test_history_in_one_big_transaction_is_read_in_pages_in_order_from_any_offset(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """One tick cannot be cut by the range size: it is read through a cursor, a page at a time
    (one transaction of 2,000 events of 50 KB held ~100 MB per client catching up before)."""
    await ferry.publish("other", 0)
    ids = await ferry.publish_many([{"stream": "big" if n % 3 else "noise", "payload": {"n": n}} for n in range(1050)])
    mine = [i for n, i in enumerate(ids) if n % 3]
    await conn.execute("select ferry.close_stream('big')")
    api = await start_api(allow_loopback=True)
    async with aiohttp.ClientSession() as session:
        got = await read_sse(session, f"{api.base}/v1/streams/big", timeout=30)
        assert [orjson.loads(e.data)["id"] for e in got[:-1]] == mine and got[-1].event == "end"
        middle = got[len(mine) // 2]
        rest = await read_sse(session, f"{api.base}/v1/streams/big", headers={"Last-Event-ID": middle.id or ""})
        assert [orjson.loads(e.data)["id"] for e in rest[:-1]] == mine[len(mine) // 2 + 1 :]


async def test_an_expired_offset_gets_410_with_the_oldest_offset_left(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    api = await start_api(allow_loopback=True)
    await ferry.publish("log:1", {"n": 1})
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(0.3)
        async with session.get(f"{api.base}/v1/streams/log:1/events") as r:
            (first,) = (await r.json())["events"]
        await ferry.publish("gone:1", 1)
        await ferry.close_stream("gone:1")
        await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
        for _ in range(4):
            await conn.fetchval("select ferry.maintain()")
            await ferry.publish("log:1", {"n": 2})
            await asyncio.sleep(0.1)
        assert await conn.fetchval("select count(*) from ferry.events where id = $1", first["id"]) == 0
        for path in ("/events", ""):
            async with session.get(f"{api.base}/v1/streams/log:1{path}?after={first['offset']}") as r:
                assert r.status == 410, await r.text()
                assert "is older than the oldest retained" in (await r.json())["error"]
        # A closed stream that retention dropped whole: over, not "wait for more".
        async with session.get(f"{api.base}/v1/streams/gone:1") as r:
            assert r.status == 204
        async with session.get(f"{api.base}/v1/streams/gone:1/events?wait=5") as r:
            assert await r.json() == {"events": [], "next": None, "closed": True}


async def test_an_idle_sse_stream_gets_heartbeat_comments_and_then_its_events(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    api = await start_api(allow_loopback=True, heartbeat=0.2)
    async with aiohttp.ClientSession() as session, session.get(f"{api.base}/v1/streams/quiet") as response:
        assert response.status == 200
        seen = b""
        async with asyncio.timeout(5):
            while seen.count(b"\n: heartbeat\n\n") < 2:  # after "retry: 2000", nothing but heartbeats
                seen += await response.content.readany()
        assert b"data:" not in seen
        event = await ferry.publish("quiet", {"n": 1})
        async with asyncio.timeout(5):
            got = [e async for e in _take(sse_events(response), 1)]
        assert orjson.loads(got[0].data)["id"] == event


async def test_a_client_that_falls_behind_reads_on_from_the_log_and_one_that_stalls_is_cut_off(
    start_api: StartApi, ferry: pgferry.Ferry, caplog: pytest.LogCaptureFixture
) -> None:
    api = await start_api(allow_loopback=True, client_buffer=5, stall_timeout=2.0)
    host, port = api.base.removeprefix("http://").split(":")
    big = "x" * 3_000_000  # five of them outgrow the socket buffers of a client that reads nothing
    async with aiohttp.ClientSession() as session:
        # One client never reads at all: its connection is cut once a write waits stall_timeout.
        _, stalled = await asyncio.open_connection(host, int(port))
        stalled.write(b"GET /v1/streams/flood HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # One reads, but more than client_buffer events come at once: it reads on from the log.
        slow = asyncio.create_task(read_sse(session, f"{api.base}/v1/streams/slow", n=20))
        # One follows another stream and is served all along.
        control = asyncio.create_task(read_sse(session, f"{api.base}/v1/streams/control", n=1))
        await asyncio.sleep(0.3)
        await ferry.publish_many([{"stream": "flood", "payload": big} for _ in range(6)])
        slow_ids = await ferry.publish_many([{"stream": "slow", "payload": n} for n in range(20)])
        await asyncio.sleep(0.5)
        started = asyncio.get_running_loop().time()
        await ferry.publish("control", "still here")
        assert len(await control) == 1
        assert asyncio.get_running_loop().time() - started < 1.5
        got = await slow
        assert [orjson.loads(e.data)["id"] for e in got] == slow_ids  # all of them, on one connection

        async def cut() -> bool:
            return api.relay.view().streams().get("let_go_stalled") == 1

        await eventually(cut, timeout=10, what="the stalled client to be cut off")
        assert api.relay.view().streams()["let_go_behind"] >= 1
        stalled.close()
    # One line says which reader, why, and how far behind it was.
    (line,) = [r.getMessage() for r in caplog.records if "cut off an SSE reader" in r.getMessage()]
    assert "of stream 'flood' from 127.0.0.1: it read nothing for 2 s, with no event sent yet" in line, line
    assert "ticks behind the log" in line and "KiB unsent" in line, line


async def test_a_relay_with_readers_connected_stops_at_once_and_they_can_resume(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    api = await start_api(allow_loopback=True, metrics=True)
    event = await ferry.publish("x", 1)
    async with aiohttp.ClientSession() as session:
        responses = [await session.get(f"{api.base}/v1/streams/x") for _ in range(5)]
        polls = [asyncio.create_task(session.get(f"{api.base}/v1/streams/y/events?wait=30")) for _ in range(5)]
        first = [e async for e in _take(sse_events(responses[0]), 1)]
        assert orjson.loads(first[0].data)["id"] == event
        await asyncio.sleep(0.2)
        async with session.get(api.relay.addresses["metrics"]) as r:
            metrics = await r.text()
        assert 'pgferry_streams_api{what="readers"} 10.0' in metrics
        assert 'pgferry_streams_api{what="followed_streams"} 2.0' in metrics
        started = asyncio.get_running_loop().time()
        await api.stop()
        assert asyncio.get_running_loop().time() - started < 5
        for response in responses:
            # ended with HTTP's last chunk (it was cut: "incomplete chunked read" in httpx, outside
            # probe); an EventSource reconnects after its last id all the same
            rest = await response.content.read()
            assert rest.endswith(b"\n\n") or response is responses[0], rest
        for poll in polls:
            with pytest.raises(aiohttp.ClientError):
                await (await poll).read()


async def _take(events: AsyncIterator[SseEvent], n: int) -> AsyncIterator[SseEvent]:
    async for event in events:
        yield event
        n -= 1
        if n == 0:
            return


async def test_clients_joining_at_random_moments_under_load_each_get_their_whole_stream_once(
    start_api: StartApi, ferry: pgferry.Ferry, db_url: str
) -> None:
    """History -> live hand-over under load: readers from the start, arriving while writers write."""
    import random

    api = await start_api(allow_loopback=True, range_events=50)  # small ranges: many hand-overs
    streams = [f"load:{n}" for n in range(12)]
    rng = random.Random(7)
    stop = asyncio.Event()

    async def writer(number: int) -> dict[str, list[int]]:
        own = await db.connect(db_url)
        written: dict[str, list[int]] = {}
        try:
            while not stop.is_set():
                stream = rng.choice(streams)
                async with own.transaction():
                    ids = [await ferry.publish(stream, {"w": number}, conn=own) for _ in range(rng.randint(1, 3))]
                written.setdefault(stream, []).extend(ids)
                await asyncio.sleep(rng.random() * 0.004)
        finally:
            await own.close()
        return written

    async with aiohttp.ClientSession() as session:
        writers = [asyncio.create_task(writer(n)) for n in range(3)]
        readers = []
        for _ in range(40):
            await asyncio.sleep(rng.random() * 0.08)
            stream = rng.choice(streams)
            readers.append(
                (stream, asyncio.create_task(read_sse_as_eventsource(session, f"{api.base}/v1/streams/{stream}", 60)))
            )
        await asyncio.sleep(0.3)
        stop.set()
        results = await asyncio.gather(*writers)
        for stream in streams:
            await ferry.close_stream(stream)
        for stream, task in readers:
            got = await task
            ids = [orjson.loads(e.data)["id"] for e in got[:-1]]
            assert got[-1].event == "end", got[-1].data
            assert sorted(ids) == sorted(i for r in results for i in r.get(stream, [])), stream
            assert len(ids) == len(set(ids)), f"duplicates on {stream}"


@pytest.mark.alone  # timing: a busy machine's pauses would look like a stalled client
async def test_a_client_reading_history_slowly_but_steadily_is_not_cut_off(
    start_api: StartApi, ferry: pgferry.Ferry
) -> None:
    """The stall timeout was around the write of a whole range of history (megabytes): a client
    reading 49 KiB/s without a pause was cut off mid-event once that took longer than it."""
    api = await start_api(allow_loopback=True, stall_timeout=0.5)
    ids = await ferry.publish_many([{"stream": "long", "payload": "y" * 10_000} for _ in range(600)])
    await ferry.close_stream("long")
    await asyncio.sleep(0.3)  # ticked: the reader gets them as history, in one range
    host, port = api.base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65_536)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    await asyncio.get_running_loop().sock_sendall(sock, b"GET /v1/streams/long HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    received = bytearray()
    while True:  # until the relay closes the connection: after the end, or cutting it off
        await asyncio.sleep(0.02)  # a few MB/s: what the kernel's buffers do not take of 6 MB of history
        try:  # (one range, one write) drains in longer than the stall timeout
            chunk = sock.recv(65_536)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    sock.close()
    assert b"event: end" in received, f"cut off after {received.count(b'id: ')} of {len(ids)} events"
    assert received.count(b"id: ") >= len(ids)


async def test_a_body_its_content_encoding_does_not_decode_logs_no_traceback_where_it_is_not_read(
    start_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused before its body was read (no token, no such route), aiohttp drained it, failed to
    decode it, and logged an ERROR with a 28-line traceback: anyone who reaches the port could
    fill the log (outside probe)."""
    api = await start_api()  # tokens required
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/streams/chat", "/v1/streams/chat/close", "/nothing"):
            # answered (401, 404) and closed, or closed as the body went on arriving
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(api.base + path, data=b'{"payload": 1}' * 1000,
                                        headers={"Content-Encoding": "gzip"}) as r:  # fmt: skip
                    assert r.status in (401, 404), r.status
    async with (
        aiohttp.ClientSession() as session,
        session.post(api.base + "/v1/streams/chat", json={"payload": 1}) as r,
    ):
        assert r.status == 401  # and it keeps serving
    await asyncio.sleep(0.2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
