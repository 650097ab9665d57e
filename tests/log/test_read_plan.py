"""Reading a batch uses the txid index even before the partition has planner statistics.

A fresh (or just truncated and refilled) partition has no statistics until
autovacuum analyzes it; a read planned as a sequential scan then costs the
whole partition per batch (migration 0007).
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from pgferry import db
from tests.helpers import tick


def _scans(plan: dict[str, object]) -> list[tuple[str, str]]:
    """(node type, relation) of every scan in an EXPLAIN (FORMAT JSON) plan tree."""
    found = []
    if "Relation Name" in plan:
        found.append((str(plan["Node Type"]), str(plan["Relation Name"])))
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        found.extend(_scans(child))
    return found


@pytest.mark.parametrize("streams", [None, ["s"]])
async def test_batch_read_uses_the_txid_index_without_statistics(
    db_url: str, conn: asyncpg.Connection, streams: list[str] | None
) -> None:
    assert (
        await conn.fetchval("select count(*) from pg_stats where schemaname = 'ferry' and tablename = 'events_0'") == 0
    )
    await conn.execute("alter table ferry.events_0 set (autovacuum_enabled = off)")  # stays un-analyzed
    await conn.execute(
        "select ferry.publish_many(array_fill('s'::text, array[100]), array_fill('{}'::jsonb, array[100]))"
        " from generate_series(1, 200)"
    )
    await conn.execute("select ferry.publish('s', '{}') from generate_series(1, 200)")
    start_tick = await tick(conn)
    # A transaction still in progress at the start tick: its event is found through the tick's xip.
    other = await db.connect(db_url)
    try:
        async with other.transaction():
            in_progress = await other.fetchval("select ferry.publish('s', '{\"late\": true}')")
            before = await tick(conn)
        await conn.execute("select ferry.publish('s', '{}')")
        end_tick = await tick(conn)
    finally:
        await other.close()
    assert start_tick is not None and before is not None and end_tick is not None

    read = "select * from ferry.batch_events($1, $2, $3)"
    plan = json.loads(await conn.fetchval(f"explain (format json) {read}", before, end_tick, streams))
    scans = _scans(plan[0]["Plan"])
    assert ("Seq Scan", "events_0") not in scans, scans
    ids = [r["id"] for r in await conn.fetch(read, before, end_tick, streams)]
    assert in_progress in ids and len(ids) == 2
