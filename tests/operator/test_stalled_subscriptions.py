"""A subscription that falls behind the retention limit (migration 0014): stalled, its gap shown by
status, trace and the metrics, never delivered past the gap until resumed from what is retained or
from now (and then replayed)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

import aiohttp
import asyncpg
import pytest
from prometheus_client import generate_latest

import pgferry
from pgferry.ops import inspect
from pgferry.ops.metrics import RelayMetrics
from tests.helpers import FAST, RunningRelay, cli, eventually, scrape, tick, value

#: what a webhook worker reads next for subscription $1 (ferry.webhook_steps peeking, acknowledging nothing)
PEEK = (
    "select id from ferry.webhook_steps(array[$1], array['webhook:' || $1], array[null::bigint], array[false],"
    " array[null::bigint], array[null::bigint], array[true], array[null::bigint], '{}', '{}', '{}', '{}', '{}', 1000)"
    " where id is not null"
)


async def stall_with_a_gap(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> tuple[list[int], list[int]]:
    """Two paused subscriptions fall two hours behind a one-hour limit; returns (lost, retained) event ids."""
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await conn.execute("select ferry.set_retention('1 hour')")
    for name in ("hook", "hook2"):
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/hook")
        await ferry.pause(name)
    lost = [await ferry.publish("s", {"n": n}) for n in range(6)]
    await tick(conn)
    await conn.execute("update ferry.ticks set created_at = created_at - interval '2 hours'")
    said = list(await conn.fetchval("select ferry.maintain()"))  # stalled, writers moved on
    retained = [await ferry.publish("s", {"n": n}) for n in range(6, 9)]
    await tick(conn)
    said += await conn.fetchval("select ferry.maintain()")  # partition 0 closed
    await tick(conn)
    said += await conn.fetchval("select ferry.maintain()")  # ... and truncated under both
    assert any(m.startswith("gap: consumer webhook:hook (stalled) never gets 6 event(s)") for m in said), said
    return lost, retained


async def test_a_stalled_subscription_shows_its_gap_and_resumes_only_when_told_where(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    lost, retained = await stall_with_a_gap(ferry, conn)
    status = {r["name"]: r for r in await inspect.subscription_status(conn)}
    assert status["hook"]["state"] == "stalled"
    assert "retention dropped 6 event(s) it had not delivered" in status["hook"]["state_reason"]
    assert status["hook"]["state_reason"].endswith("it was paused: resuming makes it deliver, so pause it again "
                                                   "after resuming to keep it paused")  # fmt: skip
    assert status["hook"]["retention"].startswith("stalled since") and "6 event(s) lost" in status["hook"]["retention"]
    assert await conn.fetch(PEEK, "hook") == [], "nothing is read for a stalled subscription"

    trace = await inspect.trace(conn, lost[2])
    assert [s["name"] for s in trace.subscriptions] == ["hook", "hook2"]
    assert trace.subscriptions[0]["state"].startswith(f"skipped: in gap {trace.gaps[0]['id']} (6 event(s)")

    metrics = RelayMetrics()
    metrics.set_retention(await inspect.retention_status(conn))
    scraped = generate_latest(metrics.registry).decode()
    assert 'pgferry_consumer_stalled{consumer="webhook:hook"} 1.0' in scraped
    assert 'pgferry_consumer_gap_events{consumer="webhook:hook"} 6.0' in scraped

    shown = await cli(pgferry_cmd, db_url, "status")
    assert "stalled" in shown.stdout and "retention: consumers holding the log back" in shown.stdout
    traced = await cli(pgferry_cmd, db_url, "trace", str(lost[0]))
    assert "falls into a recorded gap" in traced.stdout and "skipped: in gap" in traced.stdout
    refused = await cli(pgferry_cmd, db_url, "subscription", "resume", "hook")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "subscription 'hook' is stalled: retention dropped 6 event(s)" in refused.stderr

    # From what is retained: the live stream goes on with the oldest event still in the log.
    await ferry.resume("hook2", "retained")
    assert [r["id"] for r in await conn.fetch(PEEK, "hook2")] == retained

    # From now: the retained backlog is skipped (recorded), and can be replayed.
    resumed = await cli(pgferry_cmd, db_url, "subscription", "resume", "hook", "--from", "now")
    assert resumed.returncode == 0, resumed.stderr
    assert await conn.fetch(PEEK, "hook") == []
    gaps = await ferry.gaps("webhook:hook")
    assert [(g["cause"], g["events"]) for g in gaps] == [("resumed from now", 3), ("retention", 6)]
    since = datetime(2000, 1, 1, tzinfo=UTC)
    assert await inspect.replay_count(conn, "hook", since, None) == len(retained)
    queued = sum([step.queued async for step in inspect.replay(conn, "hook", since=since)])
    assert queued == len(retained)
    assert [r["event_id"] for r in await conn.fetch("select event_id from ferry.retries order by 1")] == retained


async def test_a_partitioned_subscription_counts_every_partitions_loss_and_keeps_it_across_a_change_of_partitions(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await conn.execute("select ferry.set_retention('1 hour')")
    await ferry.subscribe("ph", ["s"], "http://127.0.0.1:9/hook", partitions=3)
    await ferry.pause("ph")
    for n in range(12):
        await ferry.publish("s", {"n": n}, key=f"k{n}")
    await tick(conn)
    await conn.execute("update ferry.ticks set created_at = created_at - interval '2 hours'")
    for _ in range(3):  # stalled; partition 0 closed; truncated
        await conn.fetchval("select ferry.maintain()")
        await ferry.publish("s", {"n": "later"})
        await tick(conn)
    status = {r["name"]: r for r in await inspect.subscription_status(conn)}["ph"]
    assert status["gap_events"] == 12
    assert "12 event(s) lost" in status["retention"], status["retention"]
    assert "retention dropped 12 event(s)" in status["state_reason"], status["state_reason"]

    await ferry.resume("ph", "now")  # a gap of its own: the 3 later events
    before = {r["name"]: r for r in await inspect.subscription_status(conn)}["ph"]["gap_events"]
    assert before == 15
    await ferry.subscribe("ph", ["s"], "http://127.0.0.1:9/hook", partitions=2)
    await conn.execute("update ferry.consumers set tick_id = drain_to where drain_to is not null")  # drained
    for name in await conn.fetch("select name from ferry.consumers where drain_to is not null"):
        assert await conn.fetchval("select ferry._drop_drained_consumer($1)", name["name"])
    status = {r["name"]: r for r in await inspect.subscription_status(conn)}["ph"]
    assert status["gap_events"] == before, "the gaps of the partitions removed were deleted with them"


async def test_a_consumer_holding_the_log_back_is_named_by_status_metrics_the_dashboard_and_the_relays_log(
    ferry: pgferry.Ferry,
    conn: asyncpg.Connection,
    db_url: str,
    pgferry_cmd: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At 50% and 80% of the limit, then stalled with a gap: what a relay with metrics and a
    dashboard shows of it, and what its ticker's housekeeping logs, at WARNING."""
    caplog.set_level(logging.INFO, logger="pgferry.log.ticker")
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await conn.execute("select ferry.set_retention('10 hours')")
    await ferry.subscribe("lagging", ["s"], "http://127.0.0.1:9/hook")
    await ferry.pause("lagging")  # its cursor stays where it is
    await ferry.publish("s", {"n": 0})
    await tick(conn)

    def said(prefix: str) -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.getMessage().startswith(f"retention: {prefix}")]  # fmt: skip

    relay = RunningRelay(db_url, replace(FAST, metrics_port=0, dashboard_port=0))
    try:
        await eventually(lambda: _listening(relay), what="the metrics and dashboard servers")
        metrics, dashboard = relay.relay.addresses["metrics"], relay.relay.addresses["dashboard"]
        for age, level, pct, cls in (("5 hours 30 minutes", "50%", "55%", "warn"), ("3 hours", "80%", "85%", "bad")):
            await conn.execute(f"update ferry.ticks set created_at = created_at - interval '{age}'")

            async def warned(pct: str = pct) -> bool:
                return any("consumer webhook:lagging holds the log back" in m and pct in m for m in said("warning:"))

            await eventually(warned, what=f"the relay's warning at {level} of the limit")

            async def scraped(
                share: float = float(pct[:-1]) / 100,
            ) -> bool:  # the gauges are read at most once a second
                ratio = value(await scrape(metrics), "pgferry_consumer_retention_ratio", consumer="webhook:lagging")
                return share <= ratio < share + 0.05

            await eventually(scraped, what=f"pgferry_consumer_retention_ratio at {pct}")
            async with aiohttp.ClientSession() as session, session.get(dashboard) as r:
                page = await r.text()
            assert "<h2>Retention: consumers holding the log back</h2>" in page
            assert f'<tr data-consumer="webhook:lagging"><td>webhook:lagging</td><td class="{cls}">{level}</td>' in page
            assert f"retention {level} of the limit: cursor" in page  # the note under the subscription's state
            shown = await cli(pgferry_cmd, db_url, "status")
            assert f"{level} of the limit: cursor" in shown.stdout, shown.stdout  # the retention column
            assert "retention: consumers holding the log back" in shown.stdout

        # Past the limit, while writers go on: stalled, then a gap as its partition is truncated.
        await conn.execute("update ferry.ticks set created_at = created_at - interval '2 hours'")

        async def gapped() -> bool:
            await ferry.publish("s", {"n": "later"})
            return bool(said("gap: consumer webhook:lagging (stalled) never gets 1 event(s)"))

        await eventually(gapped, what="the relay's gap warning")
        assert said("stalled: consumer webhook:lagging is over the retention limit"), said("")

        async def stalled_gauges() -> bool:
            samples = await scrape(metrics)
            return (value(samples, "pgferry_consumer_stalled", consumer="webhook:lagging") == 1
                    and value(samples, "pgferry_consumer_gap_events", consumer="webhook:lagging") == 1)  # fmt: skip

        await eventually(stalled_gauges, what="the stalled and gap gauges")
        async with aiohttp.ClientSession() as session, session.get(dashboard) as r:
            page = await r.text()
        assert '<td class="bad">stalled</td>' in page and "retention stalled since" in page
    finally:
        await relay.stop()


async def _listening(relay: RunningRelay) -> bool:
    return {"metrics", "dashboard"} <= relay.relay.addresses.keys()
