"""The pg_net-compatible API (aiohttp sender, which follows redirects) against misbehaving receivers:
each request ends with a clear error in net._http_response, and the relay carries on."""

from __future__ import annotations

import asyncio

import asyncpg

from pgferry.receiver import CutBody, Garbage, Hang
from tests.faults.conftest import MakeReceiver
from tests.faults.test_receiver_faults import redirect_to_self
from tests.helpers import RunningRelay
from tests.pg_net.conftest import net_conn, net_db, net_relay  # noqa: F401 - fixtures
from tests.pg_net.test_net_api import responses


async def test_pg_net_requests_to_misbehaving_receivers_end_with_clear_errors(
    net_relay: RunningRelay,  # noqa: F811
    net_conn: asyncpg.Connection,  # noqa: F811
    receiver_factory: MakeReceiver,
) -> None:
    await net_conn.execute("update ferry.subscriptions set max_attempts = 1 where name = 'pg_net'")  # pg_net's way
    await asyncio.sleep(0.5)  # the relay picks up new settings on its next round (every 0.2 s here)
    looping, loop_url = await receiver_factory(redirect_to_self)
    _, garbage = await receiver_factory(lambda _: Garbage())
    _, headers_only = await receiver_factory(lambda _: CutBody(body_bytes=0))
    _, hanging = await receiver_factory(lambda _: Hang())
    healthy, ok_url = await receiver_factory()
    ids = {
        "redirect loop": await net_conn.fetchval("select net.http_get($1)", loop_url),
        "garbage": await net_conn.fetchval("select net.http_get($1)", garbage),
        "closing after headers": await net_conn.fetchval("select net.http_get($1)", headers_only),
        "hanging": await net_conn.fetchval("select net.http_get($1, timeout_milliseconds := 300)", hanging),
    }
    rows = {r["id"]: r for r in await responses(net_conn, len(ids))}
    errors = {case: rows[i]["error_msg"] for case, i in ids.items()}
    print(f"pg_net errors: {errors}")
    # libcurl's limit, then it stops
    assert errors["redirect loop"] == "Number of redirects hit maximum amount" and looping.stats.requests == 31
    assert errors["garbage"] and errors["closing after headers"]
    assert errors["hanging"].startswith("Timeout of 300 ms reached")
    assert all(rows[i]["status_code"] is None for i in ids.values())
    # ... and the relay is still delivering.
    after = await net_conn.fetchval("select net.http_get($1)", ok_url)
    rows = {r["id"]: r for r in await responses(net_conn, len(ids) + 1)}
    assert rows[after]["status_code"] == 200 and len(healthy.received) == 1
