"""Hostile names, headers and payloads: a clear error at the call, or safe handling.

Never a crashed relay or reader, never a corrupted event: every test ends by
checking that the relay is still running and that a normal event published
after the hostile one still arrives.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
import pytest

import pgferry
from pgferry.receiver import Receiver, Respond
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually, read_all

INJECTION = "x'); drop table ferry.events; --"


async def delivered(receiver: Receiver, n: int, what: str = "deliveries") -> None:
    async def enough() -> bool:
        return len(receiver.received) >= n

    await eventually(enough, timeout=15, what=what)


async def dead_letters(conn: asyncpg.Connection, n: int) -> list[asyncpg.Record]:
    async def enough() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") >= n)

    await eventually(enough, timeout=15, what=f"{n} dead letters")
    return list(await conn.fetch("select * from ferry.dead_letters order by event_id"))


async def test_sql_injection_in_names_is_data(conn: asyncpg.Connection, ferry: pgferry.Ferry) -> None:
    # stream, key, header and consumer names travel as parameters and are stored as they are
    event_id = await ferry.publish(INJECTION, {"q": INJECTION}, key=INJECTION, headers={"x-q": INJECTION})
    events = await read_all(ferry, conn, INJECTION + "consumer", streams=[INJECTION], start_at="beginning")
    assert [(e.id, e.stream, e.key, e.payload, e.headers) for e in events] == [
        (event_id, INJECTION, INJECTION, {"q": INJECTION}, {"x-q": INJECTION})
    ]
    # capture of a table and columns with quotes in their names, into a stream with quotes
    await conn.execute('create table "we""ird; drop table x; --" ("i""d" int primary key, "a\'b" text)')
    stream = await conn.fetchval(
        """select ferry.capture_table('"we""ird; drop table x; --"', stream => $1)""", INJECTION + "2"
    )
    await conn.execute('insert into "we""ird; drop table x; --" values (1, $1)', INJECTION)
    captured = await read_all(ferry, conn, "c2", streams=[stream], start_at="beginning")
    assert captured[0].payload["record"] == {'i"d': 1, "a'b": INJECTION}
    assert captured[0].payload["table"] == 'we"ird; drop table x; --' and captured[0].key == "1"
    # names that end up in identifiers or headers are refused with a clear error
    for name in (INJECTION, "a b", "", "x" * 101, "ok\r\nInjected: 1"):
        with pytest.raises(pgferry.PgferryError, match="must be 1-100 letters"):
            await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/x")
    assert await conn.fetchval("select to_regclass('ferry.events') is not null")


async def test_header_injection_is_refused_at_subscribe_and_in_the_net_api(
    ferry: pgferry.Ferry, net_conn: asyncpg.Connection
) -> None:
    refused = {
        "value with CR/LF": ({"X-Ok": "a\r\nInjected: 1"}, "header 'X-Ok' contains a line break \\(0x0D\\)"),
        "value with LF": ({"X-Ok": "a\nInjected: 1"}, "header 'X-Ok' contains a line break \\(0x0A\\)"),
        "name with CR/LF": ({"X-Ok\r\nInjected": "1"}, "is not a valid HTTP header name"),
        "name with a colon": ({"X-Ok: 1\r\nInjected": "1"}, "is not a valid HTTP header name"),
        "name with SQL": ({INJECTION: "1"}, "is not a valid HTTP header name"),
    }
    for what, (headers, message) in refused.items():
        with pytest.raises(pgferry.PgferryError, match=message):
            await ferry.subscribe("sub", ["s"], "http://127.0.0.1:9/x", headers=headers)
        with pytest.raises(asyncpg.PostgresError, match=message):
            await net_conn.fetchval(
                "select net.http_post('http://127.0.0.1:9/x', headers => $1::jsonb)", orjson.dumps(headers).decode()
            )
        assert what
    for streams in (["a\r\nInjected: 1"], ["nul\x01"], ["x" * 201]):
        with pytest.raises(pgferry.PgferryError, match="stream names must be at most 200 characters without control"):
            await ferry.subscribe("sub", streams, "http://127.0.0.1:9/x")
    for url, message in [
        ("http://127.0.0.1:9/a\r\nInjected: 1", "malformed URL"),
        ("http://127.0.0.1:9/a\x01b", "malformed URL"),
        ("http://user:pw@127.0.0.1/", "credentials do not go in the URL"),
    ]:
        with pytest.raises(pgferry.PgferryError, match=message):
            await ferry.subscribe("sub", ["s"], url)
    assert await net_conn.fetchval("select count(*) from ferry.subscriptions where name = 'sub'") == 0


async def test_a_header_value_with_a_control_character_is_refused_at_subscribe_but_not_in_the_net_api(
    conn: asyncpg.Connection, net_conn: asyncpg.Connection
) -> None:
    """Only CR, LF and NUL were refused: a subscription header holding \\x01 or DEL was accepted, and
    every event of it then got a 400 from strict servers. The pg_net API keeps pg_net's rule (its
    libcurl sends such bytes as they are)."""
    subscribe = "select ferry.subscribe('sub', array['s'], 'http://127.0.0.1:9/x', headers => $1::jsonb)"
    for value, byte, at in (("a\x01b", "01", 2), ("token\x7f", "7F", 6), ("\x1b[0m", "1B", 1), ("a\x0bb", "0B", 2)):
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.execute(subscribe, {"X-Ok": "fine", "Authorization": value})
        assert refused.value.sqlstate == "22023"
        assert refused.value.message == (
            f"pgferry: header 'Authorization' contains the control character 0x{byte} (character {at} of its value), "
            "which HTTP does not allow in a header value"
        )
        assert "tabs and non-ASCII text" in (refused.value.hint or "")
        assert await net_conn.fetchval(
            "select net.http_post('http://127.0.0.1:9/x', headers => $1::jsonb)", orjson.dumps({"X-A": value}).decode()
        )
    # HTAB and non-ASCII text are field content (RFC 9110 5.5)
    await conn.execute(subscribe, {"X-Tab": "a\tb", "X-Text": "café ÿ \x85"})
    assert await conn.fetchval("select headers->>'X-Text' from ferry.subscriptions where name = 'sub'") == "café ÿ \x85"


async def test_the_sender_never_puts_a_line_break_in_a_header(
    relay: RunningRelay, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["s"], url, headers={"X-Team": "payments"})
    # event headers are not checked by publish (hot path); the sender refuses them
    bad = await conn.fetchval("""select ferry.publish('s', '{"n": 1}', headers => '{"x-a": "1\\r\\nInjected: yes"}')""")
    deep_header = await conn.fetchval(
        "select ferry.publish('s', '{\"n\": 2}', headers => jsonb_build_object('x-deep', $1::text::jsonb))",
        "[" * 2000 + "]" * 2000,
    )
    # a key with a line break is delivered, its pgferry-key header percent-encoded
    keyed = await conn.fetchval("select ferry.publish('s', '{\"n\": 3}', key => e'k\\r\\nInjected: yes')")
    letters = await dead_letters(conn, 2)
    assert [(d["event_id"], d["attempts"]) for d in letters] == [(bad, 1), (deep_header, 1)]
    assert "event header 'x-a' contains a line break (0x0D)" in letters[0]["last_error"]
    assert "cannot be read as a JSON object of strings" in letters[1]["last_error"]
    await delivered(receiver, 1)
    # subscription headers changed behind subscribe's back are refused by the sender too
    await conn.execute("""update ferry.subscriptions set headers = '{"X-Team": "a\\r\\nInjected: yes"}'""")
    await asyncio.sleep(0.5)  # the relay picks the change up on its next round
    late = await conn.fetchval("select ferry.publish('s', '{\"n\": 4}')")
    letters = await dead_letters(conn, 3)
    assert (
        letters[-1]["event_id"] == late
        and "contains a line break (0x0D), which HTTP does not allow in a header value; not sent"
        in letters[-1]["last_error"]
    )
    got = receiver.received
    assert [orjson.loads(r.body)["n"] for r in got] == [3]
    assert all("injected" not in r.headers for r in got)
    assert (got[0].headers["pgferry-key"], got[0].headers["pgferry-key-encoding"]) == (
        "k%0D%0AInjected:%20yes",
        "percent",
    )
    assert got[0].headers["webhook-id"] == f"evt_{keyed}"
    await conn.execute("""update ferry.subscriptions set headers = '{}'""")
    await asyncio.sleep(0.5)
    await ferry.publish("s", {"n": 5})
    await delivered(receiver, 2, "a normal event after the hostile ones")
    assert not relay.task.done()


async def test_invalid_utf8_nul_and_surrogates_are_refused_at_publish(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    python_inputs: list[dict[str, Any]] = [
        {"stream": "s", "payload": "\ud800"},
        {"stream": "s", "payload": {"k\udfff": 1}},
        {"stream": "s", "payload": 1, "headers": {"x": "\ud800"}},
        {"stream": "s", "payload": 1, "key": "\ud800"},
        {"stream": "s\ud800", "payload": 1},
        {"stream": "s\x00", "payload": 1},
        {"stream": "s", "payload": "a\x00b"},
        {"stream": "s", "payload": b"\xff"},
    ]
    for event in python_inputs:
        with pytest.raises(pgferry.InvalidEvent):
            await ferry.publish(event["stream"], event["payload"], key=event.get("key"), headers=event.get("headers"))
        with pytest.raises(pgferry.InvalidEvent):
            await ferry.publish_many([event])
    sql_inputs = [
        ("""select ferry.publish('s', '"\\ud800"')""", "Unicode low surrogate must follow a high surrogate"),
        ("""select ferry.publish('s', '"\\u0000"')""", "unsupported Unicode escape sequence"),
        ("select ferry.publish(convert_from('\\xff'::bytea, 'UTF8'), '1')", "invalid byte sequence"),
        ("select ferry.publish('s', to_jsonb(convert_from('\\xc328'::bytea, 'UTF8')))", "invalid byte sequence"),
        ("select ferry.publish('s', '1', headers => '\"\\ud800\"')", "Unicode low surrogate"),
    ]
    for statement, message in sql_inputs:
        with pytest.raises(asyncpg.PostgresError, match=message):
            await conn.execute(statement)
    assert await conn.fetchval("select count(*) from ferry.events") == 0


async def test_deeply_nested_json(
    relay: RunningRelay, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["deep"], url)
    nested: list[object] = []
    for _ in range(10_000):
        nested = [nested]
    with pytest.raises(pgferry.InvalidEvent, match="Recursion limit"):
        await ferry.publish("deep", nested)
    with pytest.raises(asyncpg.PostgresError, match="stack depth limit exceeded"):
        await conn.execute("select ferry.publish('deep', $1::text::jsonb)", "[" * 200_000 + "]" * 200_000)
    # 10,000 levels are valid JSON to PostgreSQL: stored, delivered byte for byte, readable
    text = "[" * 10_000 + "]" * 10_000
    deep = await conn.fetchval("select ferry.publish('deep', $1::text::jsonb)", text)
    after = await ferry.publish("deep", {"after": True})
    await delivered(receiver, 2)
    assert [r.body for r in receiver.received] == [text.encode(), b'{"after": true}']
    events = await read_all(ferry, conn, "deep-reader", streams=["deep"], start_at="beginning")
    assert [e.id for e in events] == [deep, after]
    assert isinstance(events[0].payload, pgferry.RawJSON) and events[0].payload == text
    assert events[1].payload == {"after": True}
    assert not relay.task.done()


async def test_json_bigger_than_the_body_limit_is_a_clear_dead_letter(
    db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    from pgferry.schema import install

    await install(conn, addons=["pg_net"])
    await conn.execute("update ferry.config set max_body_bytes = 100000")
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['big'], $1)", url)
    relay = RunningRelay(db_url)  # reads the limit when it starts
    try:
        huge = orjson.dumps({"blob": "x" * 200_000}).decode()
        big = await conn.fetchval("select ferry.publish('big', $1::text::jsonb)", huge)
        request = await conn.fetchval("select net.http_post($1, $2::text::jsonb)", url, huge)
        small = await conn.fetchval("select ferry.publish('big', '{\"small\": 1}')")
        letters = await dead_letters(conn, 2)
        assert {d["event_id"] for d in letters} == {big, request}
        assert all("over the 100000-byte limit (ferry.config.max_body_bytes)" in d["last_error"] for d in letters)
        assert all(d["attempts"] == 1 for d in letters)  # permanent: not retried
        response = await conn.fetchrow("select status_code, error_msg from net._http_response where id = $1", request)
        assert response["status_code"] is None and response["error_msg"].startswith("Request body too large")
        # the payload is kept whole in the dead letter, for a replay once the limit is raised
        kept = await conn.fetchval("select payload::text from ferry.dead_letters where event_id = $1", big)
        assert orjson.loads(kept) == orjson.loads(huge)
        await delivered(receiver, 1)
        assert [orjson.loads(r.body) for r in receiver.received] == [{"small": 1}]
        assert small > big and not relay.task.done()
    finally:
        await relay.stop()


async def test_pg_net_params_and_bodies_cannot_inject(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    root = url.rsplit("/", 1)[0]
    hostile = "v\r\nInjected: 1 & x=' or 1=1 --"
    ok = await net_conn.fetchval(
        "select net.http_post($1, jsonb_build_object('text', $2::text), "
        "params => jsonb_build_object($2::text, $2::text))",
        root + "/p",
        hostile,
    )
    for bad in (root + "/a\x01b", root + "/a\r\nInjected: 1"):  # refused at the call, as libcurl refuses them
        with pytest.raises(asyncpg.PostgresError, match="Malformed input to a URL function"):
            await net_conn.fetchval("select net.http_get($1)", bad)

    async def answered() -> bool:
        return bool(await net_conn.fetchval("select count(*) from net._http_response") == 1)

    await eventually(answered, what="the request finished")
    rows = {r["id"]: r for r in await net_conn.fetch("select * from net._http_response")}
    assert rows[ok]["status_code"] == 200
    (got,) = receiver.received
    assert orjson.loads(got.body) == {"text": hostile}
    assert "injected" not in got.headers and "\r" not in got.path and "%0D%0AInjected" in got.path
    assert not net_relay.task.done()


async def test_cli_tables_show_hostile_receiver_text_as_text(
    pgferry_cmd: list[str], db_url: str, relay: RunningRelay, ferry: pgferry.Ferry, conn: asyncpg.Connection,
    receiver_factory: MakeReceiver,
) -> None:  # fmt: skip
    # What a receiver answers ends up in error texts: here rich markup in a Location header.
    _, url = await receiver_factory(lambda _: Respond(302, b"", (("Location", "[/bold][red]x"),)))
    await ferry.subscribe("hook", ["s"], url, max_attempts=1)
    await ferry.publish("s", {"n": 1})
    await dead_letters(conn, 1)
    # httptools refuses control characters in headers; other texts (response bodies) keep them
    await conn.execute("update ferry.dead_letters set last_error = last_error || e' \\x1b[2J'")
    shown = await cli(pgferry_cmd, db_url, "dlq", "list")
    assert shown.returncode == 0, shown.stderr
    assert "[/bold][red]x" in shown.stdout and "\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout


class _HeaderFlood(asyncio.Protocol):
    """A receiver that answers with one header that never ends."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.task: asyncio.Task[None] | None = None

    def data_received(self, data: bytes) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.flood())

    async def flood(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nX-Flood: ")  # type: ignore[attr-defined]
        while not self.transport.is_closing():
            self.transport.write(b"a" * 16384)  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)


async def test_a_receiver_sending_an_endless_header_is_cut_off() -> None:
    from pgferry.delivery.fasthttp import FastSender

    server = await asyncio.get_running_loop().create_server(_HeaderFlood, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    sender = FastSender(pool_size=1)
    try:
        for capture in (False, True):  # a webhook, a pg_net request
            result = await sender.request("POST", url, b"{}", {}, timeout=5, connect_timeout=1, capture=capture)
            # refused after a bounded amount (MAX_HEAD_BYTES), not buffered until the timeout
            assert result.error_class == "invalid_response" and result.latency_ms < 2000, result
    finally:
        await sender.close()
        server.close()
