"""A delivered acknowledgement is one row of ferry.deliveries, not one per event (migration 0029),
and every reader of the attempt history still sees each event's attempt."""

from __future__ import annotations

import asyncpg

from pgferry import sql
from pgferry.ops import inspect
from tests.helpers import MakeReceiver, RunningRelay, eventually


async def test_a_delivered_batch_is_one_row_that_trace_status_and_pruning_read(
    relay: RunningRelay, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('bulk', array['s'], $1, batch_size => 100)", url)
    ids = await conn.fetchval(
        "select array_agg(ferry.publish('s', jsonb_build_object('n', g))) from generate_series(1, 300) g"
    )

    async def recorded() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.attempt_history()") == 300)

    await eventually(recorded, timeout=30, what="300 attempts recorded")
    history = await conn.fetch("select event_id, attempt, status, error_class, latency_ms from ferry.attempt_history()")
    assert sorted(r["event_id"] for r in history) == sorted(ids)
    assert {(r["attempt"], r["status"], r["error_class"]) for r in history} == {(1, 200, None)}
    assert all(r["latency_ms"] > 0 for r in history)
    # One transaction, one batch of three requests: acknowledged together, so one row (a row per
    # acknowledgement at most: three if each request's answer rode a step of its own).
    rows = await conn.fetch("select events, event_ids from ferry.deliveries")
    assert 1 <= len(rows) <= 3
    assert await conn.fetchval("select count(*) from ferry.attempts") == 0
    for r in rows:
        assert r["event_ids"] == sorted(r["event_ids"])
        assert (r["events"].lower, r["events"].upper) == (r["event_ids"][0], r["event_ids"][-1] + 1)

    for event in (ids[0], ids[150], ids[-1]):
        traced = await inspect.trace(conn, event)
        assert [(a["subscription"], a["attempt"], a["status"]) for a in traced.attempts] == [("bulk", 1, 200)]
        assert [s["state"] for s in traced.subscriptions] == ["delivered"]
    health = {r["name"]: r for r in await conn.fetch(sql.query("endpoint_health"))}
    assert health["bulk"]["last_status"] == 200 and health["bulk"]["last_success_at"] is not None

    await conn.execute("update ferry.config set attempts_retention = '0 seconds'")
    assert await conn.fetchval("select ferry.prune_attempts()") == len(rows)
    assert await conn.fetchval("select count(*) from ferry.attempt_history()") == 0
    assert len(receiver.received) == 3
