"""Backfills and capture conditions hold whatever the session's settings, roles and the table's changes.

Each case was found by an outside probe: text pgferry stores (a deparsed condition, a
backfill's last key) read back differently in another session; a primary key changed
mid-backfill ended it as done; a condition written by one role ran with another's rights.
"""

import asyncio
import itertools
import os

import asyncpg
import pytest

import pgferry
from pgferry.capture.backfill import BackfillRunner, BackfillSettings
from pgferry.errors import InvalidBackfill
from tests.helpers import read_all

_n = itertools.count()


async def _role(conn: asyncpg.Connection, *grants: str) -> str:
    """A new role in ferry_relay (roles are cluster-wide: unique per test), with ``grants`` on tables."""
    name = f"bf_{os.getpid()}_{next(_n)}"
    await conn.execute(f"create role {name} in role ferry_relay")
    for grant in grants:
        await conn.execute(f"grant {grant} to {name}")
    return name


async def _chunks(conn: asyncpg.Connection, backfill: int) -> str:
    while True:
        row = await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
        assert row is not None
        if row["state"] != "running":
            reason = await conn.fetchval("select reason from ferry.backfills where id = $1", backfill)
            return str(row["state"]) + (f": {reason}" if reason else "")


async def test_a_capture_condition_written_under_a_dmy_datestyle_means_the_same_to_every_writer(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table dcond (id int primary key, d date, ts timestamptz)")
    await conn.execute("set datestyle = 'SQL, DMY'; set timezone = 'Asia/Kolkata'")
    await conn.execute(
        "select ferry.capture_table('dcond', condition => $$d >= '2026-01-05' and ts > '2026-01-05 10:00'$$)"
    )
    stored = await conn.fetchval("select condition from ferry.captures where table_name = 'dcond'")
    assert "'2026-01-05'::date" in stored and "+05:30" in stored, stored
    await conn.execute("reset datestyle; set timezone = 'UTC'")
    await ferry.register_consumer("c")
    # Jan 5 10:00 in Kolkata is 04:30 UTC: row 2 is just after it, row 1 just before.
    await conn.execute(
        "insert into dcond values (1, '2026-02-01', '2026-01-05 04:29 UTC'), (2, '2026-02-01', '2026-01-05 04:31 UTC'),"
        " (3, '2026-01-04', '2026-06-01 UTC'), (4, '2026-01-20', '2026-06-01 UTC')"
    )
    assert sorted(str(e.key) for e in await read_all(ferry, conn, "c")) == ["2", "4"]


async def test_a_capture_condition_naming_tableoid_is_refused_when_capture_table_is_called(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute("create table pay (id int primary key)")
    with pytest.raises(asyncpg.PostgresError, match="system column"):
        await conn.execute("select ferry.capture_table('pay', condition => 'tableoid > 0')")
    await conn.execute("insert into pay values (1)")  # not captured, and writers are untouched


async def test_a_backfill_keyed_by_date_or_float_resumes_in_another_session_without_skipping_or_stalling(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    await conn.execute("create table k_date (id date primary key)")
    await conn.execute("insert into k_date select date '2026-01-01' + g from generate_series(0, 39) g")
    await conn.execute("create table k_float (id float8 primary key)")
    await conn.execute("insert into k_float values (0.1), (0.3), (0.30000000000000004), (0.7)")
    await conn.execute("select ferry.capture_table('k_date'); select ferry.capture_table('k_float')")
    await ferry.register_consumer("c")
    await conn.execute("set datestyle = 'SQL, DMY'; set extra_float_digits = 0")
    dates = await conn.fetchval("select ferry.backfill('k_date', chunk_size => 5)")
    floats = await conn.fetchval("select ferry.backfill('k_float', chunk_size => 1)")
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", dates)
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", floats)
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", floats)
    other = await asyncpg.connect(db_url)  # the session's defaults: DateStyle ISO, MDY
    try:
        async with asyncio.timeout(20):  # a float key that reads back as another value never moves on
            assert await _chunks(other, dates) == "done"
            assert await _chunks(other, floats) == "done"
    finally:
        await other.close()
    keys = [e.key for e in await read_all(ferry, conn, "c")]
    assert len(keys) == 44 and len(set(keys)) == 44


@pytest.mark.parametrize(
    ("key", "change"),
    [
        ("id", "drop constraint alt_pkey, add primary key (u)"),
        ("id", "rename column id to k"),
        # Found by an outside probe: the same columns in another order, or of another type,
        # passed the check, and the backfill ended as done with most rows never read.
        ("id, u", "drop constraint alt_pkey, add primary key (u, id)"),
        ("id", "alter column id type text"),
    ],
)
async def test_a_primary_key_changed_renamed_reordered_or_retyped_mid_backfill_fails_it(
    conn: asyncpg.Connection, key: str, change: str
) -> None:
    await conn.execute(f"create table alt (id int, u int not null, primary key ({key}))")
    await conn.execute("insert into alt select g, 1000 - g from generate_series(1, 100) g")
    await conn.execute("select ferry.capture_table('alt')")
    backfill = await conn.fetchval("select ferry.backfill('alt', chunk_size => 10)")
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    await conn.execute(f"alter table alt {change}")
    outcome = await _chunks(conn, backfill)
    assert outcome.startswith("failed: the primary key of public.alt changed"), outcome


async def test_a_backfill_recorded_before_0033_still_goes_on_when_its_key_kept_its_columns(
    conn: asyncpg.Connection,
) -> None:
    """Its last key's shape is unknown (NULL): the names alone are compared, as before."""
    await conn.execute("create table old_bf (id int primary key)")
    await conn.execute("insert into old_bf select generate_series(1, 25)")
    await conn.execute("select ferry.capture_table('old_bf')")
    backfill = await conn.fetchval("select ferry.backfill('old_bf', chunk_size => 10)")
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    await conn.execute("update ferry.backfills set last_key_columns = null where id = $1", backfill)
    assert await _chunks(conn, backfill) == "done"
    assert await conn.fetchval("select rows_done from ferry.backfills where id = $1", backfill) == 25


async def test_a_backfill_whose_capture_moved_to_a_stream_its_target_does_not_read_fails(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table sw (id int primary key)")
    await conn.execute("insert into sw select generate_series(1, 20)")
    await conn.execute("select ferry.capture_table('sw')")
    await ferry.register_consumer("c", ["public.sw"])
    backfill = await conn.fetchval("select ferry.backfill('sw', consumer => 'c', chunk_size => 5)")
    await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    await conn.execute("select ferry.capture_table('sw', stream => 'sw_renamed')")
    outcome = await _chunks(conn, backfill)
    assert "now captured into stream 'sw_renamed', which c does not read" in outcome, outcome


async def test_a_backfill_with_a_condition_runs_only_as_the_role_that_wrote_it(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute("create table f1 (id int primary key)")
    await conn.execute("insert into f1 select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('f1')")
    role = await _role(conn, "select, update on f1")
    await conn.execute(f"set role {role}")
    backfill = await conn.fetchval("select ferry.backfill('f1', condition => 'id > 2')")
    await conn.execute("reset role")
    with pytest.raises(asyncpg.PostgresError, match=f"written by role {role}, so only that role runs it"):
        await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    runner = BackfillRunner(conn, BackfillSettings(backfill))
    with pytest.raises(InvalidBackfill, match="only that role runs it"):
        await runner.run(asyncio.Event())
    await conn.execute(f"set role {role}")
    assert await _chunks(conn, backfill) == "done"
    await conn.execute("reset role")


async def test_a_role_without_update_on_the_table_is_told_at_once_that_for_share_needs_it(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute("create table f2 (id int primary key)")
    await conn.execute("select ferry.capture_table('f2')")
    role = await _role(conn, "select on f2")
    await conn.execute(f"set role {role}")
    try:
        with pytest.raises(asyncpg.PostgresError, match=r"needs the SELECT privilege and UPDATE") as caught:
            await conn.execute("select ferry.backfill('f2')")
        assert f"grant select, update (id) on f2 to {role}" in str(caught.value.as_dict().get("hint"))
    finally:
        await conn.execute("reset role")


async def test_a_chunk_that_times_out_on_a_lock_is_tried_again_and_the_backfill_finishes(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    await conn.execute("create table slow (id int primary key)")
    await conn.execute("insert into slow select generate_series(1, 30)")
    await conn.execute("select ferry.capture_table('slow')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('slow', chunk_size => 10)")
    writer = await asyncpg.connect(db_url)
    locked = writer.transaction()
    await locked.start()
    await writer.execute("select * from slow where id = 5 for update")  # a writer holds a row of the chunk ...
    await conn.execute("set lock_timeout = '50ms'")
    runner = BackfillRunner(conn, BackfillSettings(backfill, busy_wait=0.01, transient_tries=2))
    with pytest.raises(InvalidBackfill, match=r"canceling statement due to lock timeout.*still running"):
        await runner.run(asyncio.Event())
    assert await conn.fetchval("select state from ferry.backfills where id = $1", backfill) == "running"
    await locked.rollback()  # ... until it lets go
    await writer.close()
    assert await BackfillRunner(conn, BackfillSettings(backfill)).run(asyncio.Event()) == "done"
    assert len(await read_all(ferry, conn, "c")) == 30


async def test_columns_named_like_the_generated_aliases_and_their_fallbacks_still_capture_updates(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table al (id int primary key, n int, pgferry_n int, o int, pgferry_o int, r int)")
    await conn.execute("select ferry.capture_table('al')")
    await ferry.register_consumer("c")
    await conn.execute("insert into al values (1, 2, 3, 4, 5, 6)")
    await conn.execute("update al set n = 20")
    events = await read_all(ferry, conn, "c")
    assert [e.payload["type"] for e in events] == ["INSERT", "UPDATE"]
    assert events[1].payload["record"] == {"id": 1, "n": 20, "pgferry_n": 3, "o": 4, "pgferry_o": 5, "r": 6}
    assert events[1].payload["old_record"]["n"] == 2


async def test_a_temporary_table_is_refused(conn: asyncpg.Connection) -> None:
    await conn.execute("create temporary table scratch (id int primary key)")
    with pytest.raises(asyncpg.PostgresError, match="temporary table"):
        await conn.execute("select ferry.capture_table('scratch')")


async def test_a_backfill_writes_bytea_in_hex_whatever_its_runner_s_bytea_output(conn: asyncpg.Connection) -> None:
    """A role with bytea_output 'escape' ran a backfill: its READ events carried another key than
    the same row's later UPDATE (outside probe)."""
    await conn.execute("create table bk (id bytea primary key, v int)")
    await conn.execute("insert into bk values ('\\x0102ff', 1)")
    await conn.execute("select ferry.capture_table('bk')")
    backfill = await conn.fetchval("select ferry.backfill('bk')")
    await conn.execute("set bytea_output = 'escape'")
    try:
        assert await _chunks(conn, backfill) == "done"
    finally:
        await conn.execute("reset bytea_output")
    await conn.execute("update bk set v = 2")
    rows = await conn.fetch("select op::text, key, payload::text from ferry.events order by id")
    assert [r["op"] for r in rows] == ["R", "U"]
    assert rows[0]["key"] == rows[1]["key"] == "\\x0102ff", rows
    assert '"\\\\x0102ff"' in rows[0]["payload"], rows
