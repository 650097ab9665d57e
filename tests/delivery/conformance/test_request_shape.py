"""What pgferry puts on the wire is valid HTTP for strict servers, whatever the event holds."""

from __future__ import annotations

import asyncpg
import orjson

import pgferry
from tests.delivery.conformance.servers import Aiohttp, RealServer, Uvicorn
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
        return bool(await conn.fetchval("select count(*) from ferry.attempt_history()") == len(KEYS))

    await eventually(settled, what=f"{len(KEYS)} attempts")
    statuses = await conn.fetch("select status, error_class from ferry.attempt_history()")
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


#: Header values RFC 9110 does not allow, each refused by some strict server: llhttp (aiohttp's
#: parser, Node's) answers 400 to all of them, h11 (uvicorn) to VT and FF.
BAD_VALUES = {"SOH": "a\x01b", "VT": "a\x0bb", "FF": "a\x0cb", "US": "a\x1fb", "DEL": "a\x7fb"}
#: ... and values they all take: HTAB, UTF-8 text and a C1 character (its UTF-8 bytes are obs-text).
GOOD_VALUES = {"tab": "a\tb", "text": "café", "C1": "a\x85b"}


async def test_a_header_value_with_a_control_character_is_never_sent_to_llhttp(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, aiohttp_web: Aiohttp
) -> None:
    await _header_values_reach(aiohttp_web, db_url, conn, ferry)


async def test_a_header_value_with_a_control_character_is_never_sent_to_h11(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, uvicorn_h11: Uvicorn
) -> None:
    await _header_values_reach(uvicorn_h11, db_url, conn, ferry)


async def _header_values_reach(strict: RealServer, db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry) -> None:
    """Event headers (ferry.publish does not check their values) and subscription headers changed
    behind ferry.subscribe's back went out raw: a strict server answered 400 and the events were
    retried into dead letters. Now such an event fails at once as bad_request, saying which header
    and which byte; HTAB and non-ASCII text still go."""
    await ferry.subscribe("events", ["s"], strict.url("/ok"), max_attempts=3)
    await ferry.subscribe("stored", ["t"], strict.url("/ok"), max_attempts=3, headers={"X-Team": "ok"})
    await conn.execute("""update ferry.subscriptions set headers = '{"X-Team": "a\\u007fb"}' where name = 'stored'""")
    ids = {}
    for what, value in {**BAD_VALUES, **GOOD_VALUES}.items():
        ids[what] = await ferry.publish("s", {"what": what}, headers={"x-value": value})
    stored = await ferry.publish("t", {"what": "stored"})
    relay = RunningRelay(db_url)
    try:

        async def settled() -> bool:
            return bool(await conn.fetchval("select count(*) from ferry.attempt_history()") >= len(ids) + 1)

        await eventually(settled, what=f"{len(ids) + 1} attempts")
    finally:
        await relay.stop()
    attempts = {r["event_id"]: r for r in await conn.fetch("select * from ferry.attempt_history()")}
    for what, value in BAD_VALUES.items():
        a = attempts[ids[what]]
        assert (a["status"], a["error_class"]) == (None, "bad_request"), (what, dict(a))
        byte = f"0x{ord(value[1]):02X}"
        assert a["error"] == (f"event header 'x-value' contains the control character {byte}, which HTTP does not "
                              "allow in a header value")  # fmt: skip
    assert [(attempts[ids[w]]["status"], attempts[ids[w]]["error_class"]) for w in GOOD_VALUES] == [(200, None)] * 3
    a = attempts[stored]
    assert (a["status"], a["error_class"]) == (None, "bad_request")
    assert (
        a["error"]
        == "header 'x-team' contains the control character 0x7F, which HTTP does not allow in a header value; not sent"
    )
    dead = await conn.fetch("select event_id, attempts from ferry.dead_letters order by event_id")
    assert [tuple(d) for d in dead] == sorted([(ids[w], 1) for w in BAD_VALUES] + [(stored, 1)])
