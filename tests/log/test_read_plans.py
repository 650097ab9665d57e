"""Readers' sessions keep the log's index in their plans, whatever the statistics say."""

import asyncpg
import pytest

from pgferry import db, sql
from tests.helpers import explained, webhook_steps

#: (query, its parameter types, values to explain it with)
READS = {
    "streams_events": ("bigint, bigint, text[]", "1, 2, '{a,b}'"),  # the stream hub's live feed
    "stream_events": ("bigint, bigint, text", "1, 2, 'a'"),  # a catch-up, read_stream
    "batch_events": ("bigint, bigint, text[], text", "1, 2, '{a}', 'c'"),  # Ferry.read's batches
}


async def _generic_plan(url: str, settings: dict[str, str], name: str) -> str:
    types, values = READS[name]
    conn = await db.connect(url, server_settings=settings)
    try:
        await conn.execute(f"prepare p({types}) as {sql.query(name)}")
        await conn.execute("set plan_cache_mode = force_generic_plan")  # what a long-lived session may settle on
        return "\n".join(r[0] for r in await conn.fetch(f"explain execute p({values})"))
    finally:
        await conn.close()


@pytest.mark.parametrize("name", READS)
async def test_log_reads_use_the_txid_index_after_the_empty_log_was_analyzed(
    db_url: str, conn: asyncpg.Connection, name: str
) -> None:
    """A partition analyzed while empty (a fresh install, `vacuum analyze` on a quiet database)
    made the generic plan of the hub's read a sequential scan of every partition, filtered by the
    stream names: 100 ms a tick and SSE p50 270 ms with 1,000 clients (db.LOG_READER_SETTINGS)."""
    await conn.execute("vacuum analyze ferry.events, ferry.ticks")
    assert "Seq Scan on events_0" in await _generic_plan(db_url, {}, name)  # the trap is there
    plan = await _generic_plan(db_url, dict(db.LOG_READER_SETTINGS), name)
    assert "Seq Scan on events" not in plan and "events_0_txid_idx" in plan, plan


async def test_the_relays_reads_use_the_txid_index_after_the_empty_log_was_analyzed(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """The same trap inside ferry.webhook_steps (its plans are a session's too): every webhook read
    scanned every partition whole, 50-60 ms a read with 60,000 events in one. Its plans are seen
    through auto_explain, whose output comes back as notices."""
    await conn.execute("select ferry.subscribe('w', array['s'], 'http://127.0.0.1:9/')")
    await conn.execute("select ferry.publish('s', '1')")
    await conn.execute("select ferry._tick()")
    await conn.execute("vacuum analyze ferry.events, ferry.ticks")
    async with explained(db_url) as (relay, plans):
        # one read of subscription w from its cursor, nothing to acknowledge
        rows = await webhook_steps(relay, ["w"], ["webhook:w"], max_events=100)
    assert any(row["id"] is not None for row in rows)  # it read the event
    reads = [p for p in plans if "events_0" in p]
    assert reads and not any("Seq Scan on events" in p for p in reads), reads


#: plpgsql functions the relay calls again and again in its long-lived sessions, which cache
#: their plans: each plans with enable_seqscan and jit off.
RELAY_LOOKS = {
    # the ticker's "did anything commit since the last tick" (nothing did: every condition is looked at)
    "tick": "select count(*) from ferry._tick_snapshot(false, pg_current_snapshot())",
    # housekeeping's catalogue of streams
    "catalog": "select ferry._catalog_streams()",
    # the hot read of subscription w (nothing acknowledged, so the second call reads all 5,001 events)
    "steps": "select count(*) from ferry.webhook_steps(array['w'], array['webhook:w'], array[null::bigint],"
    " array[false], array[null::bigint], array[null::bigint], array[true], array[null::bigint], '{}', '{}', '{}',"
    " '{}', '{}', null, 1 << 30)",
}


@pytest.mark.parametrize("look", RELAY_LOOKS)
async def test_the_relays_looks_at_the_log_keep_the_txid_index_once_the_log_fills(
    db_url: str, conn: asyncpg.Connection, look: str
) -> None:
    """A plan made while the log's partition was empty, cached in the session, scanned the
    partition whole on every later call, until autovacuum analyzed it (the ticker's: 110 ms a
    round with 300,000 events retained, on every round with nothing new). With enable_seqscan
    off, the scans of a sequence or of ferry.config cost enough for JIT (200 ms a call): jit off."""
    await conn.execute("select ferry.subscribe('w', array['s'], 'http://127.0.0.1:9/')")
    await conn.execute("vacuum analyze ferry.events, ferry.ticks")
    await conn.execute("select ferry.publish('s', '1')")
    await conn.execute("select ferry._tick()")
    # jit on, as in a session of anyone's calling ferry.tick() (pgferry's own have it off: db.SESSION_DEFAULTS)
    async with explained(db_url, jit="on", jit_above_cost="0") as (relay, plans):
        await relay.fetch(RELAY_LOOKS[look])  # planned with the partition (almost) empty
        await conn.execute(
            "select count(*) from ferry.publish_many(array_fill('s'::text, array[5000]),"
            " array(select to_jsonb(g) from generate_series(1, 5000) g))"
        )
        await conn.execute("select ferry._tick()")
        plans.clear()
        await relay.fetch(RELAY_LOOKS[look])  # the same session, the partition full
    looks = [p for p in plans if "events_0" in p]
    assert looks and not any("Seq Scan on events" in p for p in looks), looks
    inside = [p for p in plans if RELAY_LOOKS[look] not in p]  # the function's statements, not the call
    assert inside and not any("JIT" in p for p in inside), inside
