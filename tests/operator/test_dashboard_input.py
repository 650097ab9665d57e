"""The dashboard's answers to numbers that are not event ids, over HTTP against a real relay:
"²" passes str.isdigit() and 99999999999999999999999 is beyond bigint, and both were a 500 with
a traceback (outside probe)."""

from __future__ import annotations

import re
from dataclasses import replace

import aiohttp
import asyncpg

import pgferry
from tests.helpers import FAST, RunningRelay, eventually


async def _started(relay: RunningRelay) -> str:
    async def up() -> bool:
        return "dashboard" in relay.relay.addresses

    await eventually(up, what="the dashboard to listen")
    return relay.relay.addresses["dashboard"].rstrip("/")


async def test_event_ids_that_are_not_ascii_digits_or_beyond_bigint_get_the_clear_answer(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x")
    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0))
    try:
        base = await _started(relay)
        async with aiohttp.ClientSession() as session:
            for raw in ("%C2%B2", "99999999999999999999999", "9223372036854775808"):
                async with session.get(f"{base}/events/{raw}") as r:
                    assert r.status == 404 and "an event id is a number" in await r.text(), raw
            async with session.get(f"{base}/events/9223372036854775807") as r:  # the largest: looked up
                assert r.status == 404 and "9223372036854775807" in await r.text()
            for raw in ("²", "99999999999999999999999"):
                async with session.get(f"{base}/events", params={"id": raw}) as r:  # the search box
                    assert r.status == 200 and "an event id is a number" in await r.text(), raw

            async with session.get(f"{base}/subscriptions/hook") as r:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text())
            assert csrf is not None
            for raw in ("²", "99999999999999999999999", "12abc"):
                form = {"csrf": csrf[1], "from_event": raw, "since": ""}
                async with session.post(f"{base}/subscriptions/hook/replay", data=form) as r:
                    text = await r.text()
                    assert r.status == 200 and "an event id is a number" in text, (raw, r.status)
            form = {"csrf": csrf[1], "from_event": "", "since": "99999999d"}  # before year 1: was a 500
            async with session.post(f"{base}/subscriptions/hook/replay", data=form) as r:
                text = await r.text()
                assert r.status == 200 and "reaches back before year 1" in text, (r.status, text[:300])
    finally:
        await relay.stop()
