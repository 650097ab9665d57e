"""A subscription that falls behind the retention limit (migration 0014): stalled, its gap shown by
status, trace and the metrics, never delivered past the gap until resumed from what is retained or
from now (and then replayed)."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
from prometheus_client import generate_latest

import pgferry
from pgferry.ops import inspect
from pgferry.ops.metrics import RelayMetrics
from tests.helpers import cli, tick

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
