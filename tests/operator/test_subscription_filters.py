"""Subscription filters on the operator side: trace says which subscription skipped an event, and
apply, status, list and the dashboard carry the filter. Real PostgreSQL, relay, receivers and CLI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import aiohttp
import asyncpg
import orjson

import pgferry
from tests.helpers import FAST, MakeReceiver, RunningRelay, cli, eventually


async def test_trace_says_filtered_out_by_the_subscription_that_skipped_the_event(
    pgferry_cmd: list[str],
    db_url: str,
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("eu-only", ["orders"], url, filter='$headers.region == "eu"')
    await ferry.subscribe("audit", ["orders"], url)
    skipped = await ferry.publish("orders", {"order": 1}, headers={"region": "us"})
    sent = await ferry.publish("orders", {"order": 2}, headers={"region": "eu"})

    async def settled() -> bool:
        return len(receiver.received) == 3 and await conn.fetchval("select count(*) from ferry.attempt_history()") == 3

    await eventually(settled, what="three deliveries recorded")
    traced = orjson.loads((await cli(pgferry_cmd, db_url, "trace", str(skipped), "--json")).stdout)
    where = {s["name"]: s["state"] for s in traced["subscriptions"]}
    assert where == {"audit": "delivered", "eu-only": "filtered out by subscription eu-only"}
    traced = orjson.loads((await cli(pgferry_cmd, db_url, "trace", str(sent), "--json")).stdout)
    assert {s["name"]: s["state"] for s in traced["subscriptions"]} == {"audit": "delivered", "eu-only": "delivered"}
    table = await cli(pgferry_cmd, db_url, "trace", str(skipped))
    assert table.returncode == 0 and "filtered out by subscription eu-only" in table.stdout, table.stdout


FILTERED = """
[subscriptions.big-orders]
streams = ["public.orders"]
url = "http://127.0.0.1:9/big"
filter = '$.record.amount > 100'
"""


async def test_apply_sets_changes_and_removes_a_filter_and_refuses_a_bad_one_before_touching_anything(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "pgferry.toml"
    path.write_text(FILTERED)
    created = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert created.returncode == 0, created.stderr
    assert "filter: $.record.amount > 100" in created.stdout
    filter_of = "select filter from ferry.subscriptions where name = 'big-orders'"
    assert await conn.fetchval(filter_of) == "$.record.amount > 100"
    again = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--json")).stdout)
    assert [c["action"] for c in again["changes"]] == ["unchanged"]

    path.write_text(FILTERED.replace("> 100", "> 500"))
    plan = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--json")).stdout)
    assert plan["changes"][0]["changes"] == {"filter": {"from": "$.record.amount > 100", "to": "$.record.amount > 500"}}
    assert await conn.fetchval(filter_of) == "$.record.amount > 500"

    path.write_text(
        FILTERED.replace("> 100", "") + '\n[subscriptions.other]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n'
    )
    refused = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "[subscriptions.big-orders]: pgferry: filter '$.record.amount ' is not a predicate" in refused.stderr
    assert await conn.fetchval(filter_of) == "$.record.amount > 500"
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 1

    path.write_text("\n".join(line for line in FILTERED.splitlines() if not line.startswith("filter")))
    removed = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--json")).stdout)
    assert removed["changes"][0]["changes"] == {"filter": {"from": "$.record.amount > 500", "to": None}}
    assert await conn.fetchval(filter_of) is None


async def test_status_and_the_dashboard_show_a_subscription_s_filter(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry
) -> None:
    await ferry.subscribe("filtered", ["s"], "http://127.0.0.1:9/x", filter='$key == "<b>k</b>"')
    await ferry.subscribe("plain", ["s"], "http://127.0.0.1:9/x")
    status = orjson.loads((await cli(pgferry_cmd, db_url, "status", "--json")).stdout)
    assert {r["name"]: r["filter"] for r in status} == {"filtered": '$key == "<b>k</b>"', "plain": None}
    table = await cli(pgferry_cmd, db_url, "status")
    assert table.returncode == 0 and '$key == "<b>k</b>"' in table.stdout, table.stdout

    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0))

    async def listening() -> bool:
        return "dashboard" in relay.relay.addresses

    try:
        await eventually(listening, what="the dashboard to listen")
        base = relay.relay.addresses["dashboard"]
        async with aiohttp.ClientSession() as session:
            for page in (base, base + "subscriptions/filtered"):
                async with session.get(page) as r:
                    html = await r.text()
                    assert r.status == 200
                    assert "filter <code>$key == &quot;&lt;b&gt;k&lt;/b&gt;&quot;</code>" in html, html
    finally:
        await relay.stop()
