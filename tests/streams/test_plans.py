"""Stream readers' sessions keep the log's index in their plans, whatever the statistics say."""

import asyncpg

from pgferry import db, sql


async def _generic_plan(url: str, settings: dict[str, str], query: str) -> str:
    conn = await db.connect(url, server_settings=settings)
    try:
        await conn.execute(f"prepare p(bigint, bigint, text[]) as {query}")
        await conn.execute("set plan_cache_mode = force_generic_plan")  # what a long-lived session may settle on
        return "\n".join(r[0] for r in await conn.fetch("explain execute p(1, 2, '{a,b}')"))
    finally:
        await conn.close()


async def test_the_hub_read_uses_the_txid_index_after_the_empty_log_was_analyzed(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """A partition analyzed while empty (a fresh install, `vacuum analyze` on a quiet database)
    made the generic plan of the hub's read a sequential scan of every partition, filtered by the
    stream names: 100 ms a tick and SSE p50 270 ms with 1,000 clients (db.LOG_READER_SETTINGS)."""
    await conn.execute("vacuum analyze ferry.events, ferry.ticks")
    query = sql.query("streams_events").replace("$3::text[]", "$3")
    assert "Seq Scan on events_0" in await _generic_plan(db_url, {}, query)  # the trap is there
    plan = await _generic_plan(db_url, dict(db.LOG_READER_SETTINGS), query)
    assert "Seq Scan on events" not in plan and "events_0_txid_idx" in plan, plan
