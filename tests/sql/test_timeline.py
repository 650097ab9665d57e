"""ferry.after_promotion (migration 0039): on a new WAL timeline (a promoted standby, a restore)
no event, tick or batch gets an id the lost history may have handed to a receiver.

A timeline change is simulated here by recording another timeline than the server's;
tests/relay/test_failover.py promotes a real standby."""

from __future__ import annotations

import asyncpg
import pytest

from pgferry import db
from pgferry.schema import install
from pgferry.streams.offsets import Offset
from pgferry.streams.reader import OffsetAhead, read_range, start
from tests.sql.releases import NEWEST, install_release

STEP = 1 << 32
PER_SECOND = 1 << 24

TIMELINE = "select ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"


async def _last_ids(conn: asyncpg.Connection) -> tuple[int, int, int]:
    row = await conn.fetchrow(
        "select (select last_value from ferry.event_id_seq) as event,"
        " (select last_value from ferry.tick_id_seq) as tick, (select last_value from ferry.batch_id_seq) as batch"
    )
    assert row is not None
    return row["event"], row["tick"], row["batch"]


async def _publish(conn: asyncpg.Connection, n: int) -> list[int]:
    return [await conn.fetchval("select ferry.publish('s', $1::text::jsonb)", f'{{"n": {i}}}') for i in range(n)]


async def test_an_install_records_its_timeline_and_a_check_on_it_does_nothing(conn: asyncpg.Connection) -> None:
    assert await conn.fetchval("select timeline from ferry.config") == await conn.fetchval(TIMELINE)
    await _publish(conn, 3)
    before = await _last_ids(conn), await conn.fetchval("select instance from ferry.config")
    assert await conn.fetch("select * from ferry.after_promotion()") == []
    assert (await _last_ids(conn), await conn.fetchval("select instance from ferry.config")) == before


async def test_a_new_timeline_moves_every_id_receivers_see_past_the_old_ones(conn: asyncpg.Connection) -> None:
    old = await _publish(conn, 5)
    await conn.execute("select ferry.register_consumer('reader', array['s'], 'beginning')")
    await conn.fetchval("select ferry.tick()")
    batch = await conn.fetchrow("select * from ferry.next_batch('reader')")
    assert batch is not None
    event, tick, batch_id = await _last_ids(conn)
    instance, timeline = await conn.fetchrow("select instance, timeline from ferry.config")
    lag = "select max(t.event_seq) - (select event_seq from ferry.ticks where id = $1) from ferry.ticks t"
    lag_before = await conn.fetchval(lag, batch["start_tick"])
    await conn.execute("update ferry.config set timeline = timeline + 1")  # as if the server changed timeline

    rows = await conn.fetch("select * from ferry.after_promotion()")

    assert len(rows) == 1
    row = rows[0]
    assert (row["old_timeline"], row["new_timeline"]) == (timeline + 1, timeline)
    assert STEP <= row["step"] < STEP + 60 * PER_SECOND  # the newest tick is from this test
    assert (row["last_event_id"], row["next_event_id"]) == (event, event + row["step"] + 1)
    assert (row["old_instance"], await conn.fetchval("select instance from ferry.config")) == (
        instance,
        row["new_instance"],
    )
    assert row["new_instance"] != instance
    assert await conn.fetchval("select timeline from ferry.config") == timeline
    new = await _publish(conn, 3)
    assert new[0] == row["next_event_id"] and min(new) > max(old) + STEP
    assert await conn.fetchval("select max(id) from ferry.ticks") > tick + STEP  # its own tick past the jump
    # Batch sizes and lag are differences of the ticks' event_seq: unchanged by the jump.
    assert await conn.fetchval(lag, batch["start_tick"]) == lag_before
    await conn.execute("select ferry.finish_batch('reader', $1)", batch["batch_id"])
    await conn.fetchval("select ferry.tick()")
    assert await conn.fetchval("select batch_id from ferry.next_batch('reader')") > batch_id + STEP
    # Once only.
    assert await conn.fetch("select * from ferry.after_promotion()") == []
    assert await conn.fetchval("select instance from ferry.config") == row["new_instance"]


async def test_the_step_covers_the_time_since_the_newest_tick(conn: asyncpg.Connection) -> None:
    """The lost history may have handed out ids for as long as it ran after its newest tick seen here
    (a backup restored a day back): 2^24 a second, more than one sequence hands out."""
    await _publish(conn, 1)
    await conn.execute("update ferry.ticks set created_at = now() - interval '1 day'")
    await conn.execute("update ferry.config set timeline = timeline + 1")
    step = await conn.fetchval("select step from ferry.after_promotion()")
    assert STEP + 86400 * PER_SECOND <= step < STEP + 86460 * PER_SECOND


async def test_force_moves_the_ids_on_without_a_new_timeline(conn: asyncpg.Connection) -> None:
    """A restore that keeps the timeline (a base backup started without recovery, a dump): the
    operator says so."""
    old = await _publish(conn, 2)
    row = await conn.fetchrow("select * from ferry.after_promotion(force => true)")
    assert row is not None and row["old_timeline"] == row["new_timeline"]
    assert min(await _publish(conn, 1)) > max(old) + STEP


async def test_the_relay_role_may_run_it(db_url: str) -> None:
    conn = await db.connect(db_url)
    try:
        await conn.execute("set role ferry_relay")
        await conn.execute("update ferry.config set timeline = timeline + 1")
        assert len(await conn.fetch("select * from ferry.after_promotion()")) == 1
    finally:
        await conn.close()


async def test_an_upgrade_records_the_timeline_without_moving_any_id(empty_db_url: str) -> None:
    conn = await db.connect(empty_db_url)
    try:
        await install_release(conn, NEWEST)
        await _publish(conn, 4)
        before = await _last_ids(conn)
        await install(conn)
        assert await conn.fetchval("select timeline from ferry.config") == await conn.fetchval(TIMELINE)
        assert await _last_ids(conn) == before
        assert await conn.fetch("select * from ferry.after_promotion()") == []
    finally:
        await conn.close()


async def test_a_stream_offset_of_the_lost_history_reads_every_new_event(conn: asyncpg.Connection) -> None:
    """A reader resuming from an offset the lost history gave it (a tick and an id this server never
    had): refused as ahead before, read on from after the jump."""
    await _publish(conn, 3)
    newest = await conn.fetchval("select ferry.tick(true)")
    lost = Offset(newest + 5, await conn.fetchval("select last_value from ferry.event_id_seq") + 40)
    with pytest.raises(OffsetAhead):
        await start(conn, "s", lost)
    await conn.execute("update ferry.config set timeline = timeline + 1")
    await conn.execute("select * from ferry.after_promotion()")
    new = await _publish(conn, 3)
    await conn.fetchval("select ferry.tick()")
    position = await start(conn, "s", lost)
    assert position is not None
    read = await read_range(conn, "s", position, 1000)
    assert read is not None and [e.id for e in read[0]] == new
