"""What pgferry puts on the wire is valid HTTP for strict servers, whatever the event holds."""

from __future__ import annotations

import asyncpg
import orjson

import pgferry
from tests.delivery.conformance.servers import Uvicorn
from tests.helpers import RunningRelay, eventually

KEYS = ["plain-1", "ctl\x01key", "café", " padded ", "50%"]


async def test_a_key_with_control_characters_reaches_a_strict_server_percent_encoded(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, uvicorn_h11: Uvicorn
) -> None:
    """A text primary key holding \\x01 once went raw into pgferry-key: h11 answered 400 and the
    events ended in dead letters. The header is percent-encoded now; the body keeps the key exact."""
    await conn.execute("create table items (code text primary key, n int)")
    await conn.execute("select ferry.capture_table('items')")
    await ferry.subscribe("strict", ["public.items"], uvicorn_h11.url("/ok"), max_attempts=1)
    before = len(uvicorn_h11.requests)
    await conn.execute("insert into items select k, i from unnest($1::text[]) with ordinality as u(k, i)", KEYS)

    async def settled() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.attempts") == len(KEYS))

    await eventually(settled, what=f"{len(KEYS)} attempts")
    statuses = await conn.fetch("select status, error_class from ferry.attempts")
    assert [tuple(s) for s in statuses] == [(200, None)] * len(KEYS)
    got = {orjson.loads(body)["record"]["code"]: headers for headers, body in uvicorn_h11.requests[before:]}
    assert sorted(got) == sorted(KEYS)  # the body keeps each key exact
    assert {k: (h["pgferry-key"], h.get("pgferry-key-encoding")) for k, h in got.items()} == {
        "plain-1": ("plain-1", None),
        "50%": ("50%", None),
        "ctl\x01key": ("ctl%01key", "percent"),
        "café": ("caf%C3%A9", "percent"),
        " padded ": ("%20padded%20", "percent"),
    }
