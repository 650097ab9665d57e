"""Where pg_net users' SQL and monitoring match on pg_net's exact behaviour: URL errors,
lenient answers, timeout texts, and cancelling queued requests with DELETE or TRUNCATE."""

from __future__ import annotations

import asyncio
import re

import asyncpg
import pytest

from pgferry import db
from pgferry.receiver import Hang, Respond
from pgferry.schema import install
from tests.helpers import MakeReceiver, RunningRelay, eventually
from tests.sql.releases import install_release, release


async def responses(conn: asyncpg.Connection, n: int) -> dict[int, asyncpg.Record]:
    async def enough() -> bool:
        return bool(await conn.fetchval("select count(*) from net._http_response") >= n)

    await eventually(enough, timeout=20, what=f"{n} responses")
    return {r["id"]: r for r in await conn.fetch("select * from net._http_response")}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("localhost:6666", "Unsupported URL scheme"),  # libcurl reads "localhost" as the scheme
        ("ftp://example.com/x", "Unsupported URL scheme"),
        ("/malformed_url", "Bad scheme"),
        ("http://exa mple.com/", "Malformed input to a URL function"),
        ("http:/example.com", "Unsupported number of slashes following scheme"),
        ("http:///path", "No host part in the URL"),
        ("http://example.com:99999/", "Port number was not a decimal number between 0 and 65535"),
        ("http://example.com:8o/", "Port number was not a decimal number between 0 and 65535"),
        ("http://[fe80::zz]/", "Bad IPv6 address"),
        ("http://exa<mple.com/", "Bad hostname"),
    ],
)
async def test_invalid_urls_fail_at_the_call_with_libcurl_s_words(
    net_conn: asyncpg.Connection, url: str, reason: str
) -> None:
    with pytest.raises(asyncpg.PostgresError) as raised:
        await net_conn.execute("select net.http_get($1)", url)
    assert raised.value.sqlstate == "22023"
    assert str(raised.value) == f'invalid URL "{url}": {reason}'


async def test_valid_urls_are_accepted_as_pg_net_accepts_them(net_conn: asyncpg.Connection) -> None:
    for url in ("http://example.com", "https://user:pw@example.com:8443/a?b=c#d", "http://[::1]:80/", "HTTP://X.Y"):
        await net_conn.execute("select net.http_get($1)", url)


async def test_a_header_name_with_spaces_is_recorded_as_pg_net_records_it(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    _, url = await receiver_factory(lambda _: Respond(200, b"ok", (("Spaces In Header Name", "x"),)))
    request = await net_conn.fetchval("select net.http_get($1)", url)
    row = (await responses(net_conn, 1))[request]
    assert (row["status_code"], row["error_msg"]) == (200, None)
    assert '"Spaces In Header Name": "x"' in row["headers"]


async def test_a_header_value_with_a_control_character_goes_out_as_libcurl_sends_it(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """pg_net refuses only CR and LF; libcurl writes \\x01 or DEL as they are (checked with curl -H).
    Webhooks refuse them (a strict server would answer 400); the pg_net path does as pg_net does."""
    receiver, url = await receiver_factory()
    request = await net_conn.fetchval(
        "select net.http_post($1, headers => $2::jsonb)", url, '{"X-Odd": "a\\u0001b\\u007fc", "X-Tab": "a\\tb"}'
    )
    row = (await responses(net_conn, 1))[request]
    assert (row["status_code"], row["error_msg"]) == (200, None)
    got = receiver.received[0].headers
    assert (got["x-odd"], got["x-tab"]) == ("a\x01b\x7fc", "a\tb")


async def test_a_timeout_reads_like_pg_net_s_with_the_time_of_each_phase(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    await net_conn.execute("update ferry.subscriptions set max_attempts = 1 where name = 'pg_net'")
    await asyncio.sleep(0.5)  # the relay picks up new settings on its next round
    _, url = await receiver_factory(lambda _: Hang())
    request = await net_conn.fetchval("select net.http_get($1, timeout_milliseconds := 300)", url)
    row = (await responses(net_conn, 1))[request]
    number = r"(\d+\.\d{6})"
    match = re.fullmatch(
        rf"Timeout of 300 ms reached\. Total time: {number} ms \(DNS time: {number} ms, "
        rf"TCP/SSL handshake time: {number} ms, HTTP Request/Response time: {number} ms\)",
        row["error_msg"],
    )
    assert match, row["error_msg"]
    total, dns, handshake, exchange = (float(g) for g in match.groups())
    assert row["timed_out"] is True and 290 <= total < 1000 and 250 <= exchange <= total
    assert dns + handshake + exchange == pytest.approx(total, abs=1.0)


async def test_delete_and_truncate_cancel_queued_requests(
    net_db: str, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    ids = [await net_conn.fetchval("select net.http_get($1)", f"{url}?n={n}") for n in range(5)]
    # no relay yet: all five are queued; cancel two by id, as pg_net users do
    assert await net_conn.fetchval("select count(*) from net.http_request_queue") == 5
    await net_conn.execute("delete from net.http_request_queue where id = any($1)", ids[1:3])
    relay = RunningRelay(net_db)
    try:
        rows = await responses(net_conn, 3)
        assert sorted(rows) == [ids[0], *ids[3:]]
        assert sorted(r.path for r in receiver.received) == [f"/hook?n={n}" for n in (0, 3, 4)]
        assert await net_conn.fetchval("select count(*) from net.http_request_queue") == 0
        await relay.stop()
        more = [await net_conn.fetchval("select net.http_get($1)", url) for _ in range(3)]
        await net_conn.execute("truncate net.http_request_queue")
        relay = RunningRelay(net_db)
        await asyncio.sleep(1.0)  # time to send them, were they still queued
        assert not set(more) & set(await responses(net_conn, 3)) and len(receiver.received) == 3
        assert (
            await net_conn.fetchval("select count(*) from ferry.attempt_history() where event_id = any($1)", more) == 0
        )
    finally:
        await relay.stop()


async def test_deleting_a_request_waiting_for_its_retry_stops_its_retries(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    await net_conn.execute("update ferry.subscriptions set retry_base_ms = 2000, retry_max_ms = 2000")
    await asyncio.sleep(0.5)
    receiver, url = await receiver_factory(lambda _: Respond(503, b"busy"))
    request = await net_conn.fetchval("select net.http_get($1)", url)

    async def parked() -> bool:
        return bool(await net_conn.fetchval("select count(*) from ferry.retries where event_id = $1", request))

    await eventually(parked, what="the request parked for a retry")
    await net_conn.execute("delete from net.http_request_queue where id = $1", request)
    assert not await parked()
    await asyncio.sleep(2.5)  # past its retry time
    assert receiver.stats.requests == 1
    assert await net_conn.fetchval("select count(*) from net._http_response") == 0


async def test_requests_queued_before_the_queue_became_a_table_are_kept_and_sent(
    empty_db_url: str, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    conn = await db.connect(empty_db_url)
    try:
        await install_release(conn, release("2ced9d6"))  # the pg_net add-on as released before migration 0004
        ids = [await conn.fetchval("select net.http_get($1)", f"{url}?old={n}") for n in range(3)]
        assert await conn.fetchval("select count(*) from net.http_request_queue") == 3  # the old view
        applied = await install(conn)  # upgrades the installed add-on too
        assert "pg_net:0004_request_queue" in applied
        assert [r[0] for r in await conn.fetch("select id from net.http_request_queue order by id")] == ids
        relay = RunningRelay(empty_db_url)
        try:
            assert sorted(await responses(conn, 3)) == ids
        finally:
            await relay.stop()
        assert len(receiver.received) == 3
    finally:
        await conn.close()
