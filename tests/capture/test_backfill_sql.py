"""ferry.backfill and ferry.backfill_chunk in SQL: READ events, chunks, keys, targets, bad input."""

import asyncio
import os
import warnings

import asyncpg
import pytest

import pgferry
from pgferry import db, sql
from pgferry.errors import CaptureWarning
from tests.helpers import eventually, read_all


async def _run(conn: asyncpg.Connection, backfill: int) -> str:
    """Drive a backfill to its end from SQL, one chunk per transaction, as a runner does."""
    while True:
        row = await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
        assert row is not None
        if row["state"] != "running":
            reason = await conn.fetchval("select reason from ferry.backfills where id = $1", backfill)
            return str(row["state"]) + (f": {reason}" if reason else "")


async def test_every_row_becomes_one_read_event_in_primary_key_order_in_chunks(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table orders (id int primary key, item text)")
    await conn.execute("insert into orders select g, 'item ' || g from generate_series(1, 25) g")
    await conn.execute("select ferry.capture_table('orders')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('orders', chunk_size => 10)")
    assert await _run(conn, backfill) == "done"
    events = await read_all(ferry, conn, "c")
    assert [e.key for e in events] == [str(i) for i in range(1, 26)]
    record = {"id": 1, "item": "item 1"}
    assert events[0].payload == {
        "type": "READ",
        "schema": "public",
        "table": "orders",
        "record": record,
        "old_record": None,
    }
    row = await conn.fetchrow("select * from ferry.backfills where id = $1", backfill)
    assert (row["rows_done"], row["chunks_done"], row["last_key"], row["finished_at"] is not None) == (
        25, 3, {"id": "20"}, True,
    )  # fmt: skip


async def test_composite_primary_keys_are_walked_in_order_and_keyed_like_captured_rows(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table lines (order_id int, line text, qty int, primary key (order_id, line))")
    await conn.execute(
        "insert into lines select o, 'l' || l, o * l from generate_series(1, 5) o, generate_series(1, 3) l"
    )
    await conn.execute("select ferry.capture_table('lines')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('lines', chunk_size => 4)")
    assert await _run(conn, backfill) == "done"
    events = await read_all(ferry, conn, "c")
    assert [e.key for e in events] == [f'[{o}, "l{line}"]' for o in range(1, 6) for line in range(1, 4)]
    assert {e.payload["type"] for e in events} == {"READ"}


async def test_an_empty_table_is_done_after_one_chunk_with_no_event(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key)")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('t')")
    row = await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    assert (row["state"], row["rows_done"], row["chunk_rows"]) == ("done", 0, 0)
    assert await read_all(ferry, conn, "c") == []


async def test_a_condition_picks_the_rows_and_a_consumer_target_reaches_only_that_consumer(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key, paid boolean)")
    await conn.execute("insert into t select g, g % 2 = 0 from generate_series(1, 10) g")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("mine")
    await ferry.register_consumer("other")
    backfill = await conn.fetchval(
        "select ferry.backfill('t', consumer => 'mine', condition => 'paid', chunk_size => 2)"
    )
    assert await _run(conn, backfill) == "done"
    await conn.execute("insert into t values (11, true)")
    assert [e.key for e in await read_all(ferry, conn, "mine")] == ["2", "4", "6", "8", "10", "11"]
    assert [e.key for e in await read_all(ferry, conn, "other")] == ["11"]


async def test_a_condition_is_stored_as_one_deparsed_expression_and_runs_as_written(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key, paid boolean); create table vip (id int)")
    await conn.execute("insert into t select g, g % 2 = 0 from generate_series(1, 10) g; insert into vip values (3)")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval(
        "select ferry.backfill('t', condition => $$paid -- even ones\n or id in (select id from vip) /* and 3 */$$,"
        " chunk_size => 2)"
    )
    condition = await conn.fetchval("select condition from ferry.backfills where id = $1", backfill)
    assert "--" not in condition and "/*" not in condition and "public.vip" in condition
    assert await _run(conn, backfill) == "done"
    assert [e.key for e in await read_all(ferry, conn, "c")] == ["2", "3", "4", "6", "8", "10"]


async def test_cancel_and_pause_stop_the_next_chunk_and_resume_goes_on_after_the_last_one(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 3)")
    await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)
    assert await conn.fetchval("select ferry.backfill_pause($1)", backfill) == "paused"
    row = await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill)
    assert (row["state"], row["chunk_rows"]) == ("paused", 0)
    assert await conn.fetchval("select ferry.backfill_resume($1)", backfill) == "running"
    await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)
    assert await conn.fetchval("select ferry.backfill_cancel($1)", backfill) == "cancelled"
    assert await _run(conn, backfill) == "cancelled"
    assert [e.key for e in await read_all(ferry, conn, "c")] == ["1", "2", "3", "4", "5", "6"]
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetchval("select ferry.backfill_resume($1)", backfill)
    assert caught.value.sqlstate == "55000" and "cancelled" in str(caught.value)
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetchval("select ferry.backfill_cancel(12345)")
    assert caught.value.sqlstate == "42704"


@pytest.mark.parametrize(
    ("call", "sqlstate", "says"),
    [
        ("ferry.backfill('nope')", "42P01", 'relation "nope" does not exist'),
        ("ferry.backfill('uncaptured')", "55000", "is not captured"),
        ("ferry.backfill('nopk')", "42P10", "has no primary key"),
        ("ferry.backfill('t', condition => 'no_such_column > 1')", "42703", "not a valid boolean expression"),
        ("ferry.backfill('t', condition => 'id')", "42804", "not a valid boolean expression"),
        ("ferry.backfill('t', condition => 'true) or (true; drop table t')", "42601", "not a valid boolean expression"),
        # Checked as it runs: the table is r in the chunk's statement, and a trailing comment or a
        # closing parenthesis cannot reach past the condition (both passed the old check).
        ("ferry.backfill('t', condition => 't.id > 3')", "42P01", "the table is aliased r"),
        ("ferry.backfill('t', condition => 'id > 0) --')", "42601", "not a valid boolean expression"),
        ("ferry.backfill('t', condition => 'id > 0) group by (1')", "42601", "not a valid boolean expression"),
        ("ferry.backfill('t', condition => 'id > 1) or (true')", "42601", "its parentheses do not balance"),
        ("ferry.backfill('t', condition => '  ')", "22023", "condition is empty"),
        ("ferry.backfill(null)", "22004", "ferry.backfill needs a table, not NULL"),
        ("ferry.backfill('v')", "42809", "v is not a table: only tables can be captured, and so backfilled"),
        ("ferry.backfill('mv')", "42809", "mv is not a table"),
        ("ferry.backfill('ferry.subscriptions')", "42809", "pgferry's own tables: it cannot be captured, nor"),
        ("ferry.backfill('t', chunk_size => 0)", "22023", "chunk_size must be between 1 and 1000000"),
        ("ferry.backfill('t', subscription => 'nobody')", "42704", "subscription 'nobody' does not exist"),
        ("ferry.backfill('t', consumer => 'nobody')", "42704", "consumer 'nobody' does not exist"),
        ("ferry.backfill('t', consumer => 'elsewhere')", "22023", "does not read stream 'public.t'"),
        ("ferry.backfill('t', consumer => 'c', subscription => 's')", "22023", "not both"),
    ],
)
async def test_bad_input_is_refused_with_the_problem_named_and_nothing_recorded(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, call: str, sqlstate: str, says: str
) -> None:
    await conn.execute("create table t (id int primary key); create table uncaptured (id int primary key)")
    await conn.execute("create table nopk (sku text)")
    await conn.execute("create view v as select 1 as id; create materialized view mv as select 1 as id")
    await conn.execute("select ferry.capture_table('t'), ferry.capture_table('nopk', key_columns => array['sku'])")
    await ferry.register_consumer("c")
    await ferry.register_consumer("elsewhere", ["other.stream"])
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetchval(f"select {call}")
    assert caught.value.sqlstate == sqlstate and says in str(caught.value)
    assert await conn.fetchval("select count(*) from ferry.backfills") == 0
    assert await conn.fetchval("select count(*) from t") == 0


async def _one_chunk_in(conn: asyncpg.Connection) -> int:
    """A backfill of a captured table t of 10 rows, chunks of 3, its first chunk done."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('t')")
    backfill: int = await conn.fetchval("select ferry.backfill('t', chunk_size => 3)")
    await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)
    return backfill


async def test_a_table_uncaptured_midway_fails_the_backfill_with_the_reason(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    backfill = await _one_chunk_in(conn)
    await conn.execute("select ferry.uncapture_table('t')")
    assert await _run(conn, backfill) == "failed: table public.t is no longer captured (SQLSTATE 55000)"


async def test_a_backfill_whose_subscription_was_removed_midway_says_so(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """It said the table was now captured into another stream (outside probe)."""
    await ferry.subscribe("gone", ["public.t"], "http://127.0.0.1:9/")
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('t')")
    backfill = await conn.fetchval("select ferry.backfill('t', subscription => 'gone', chunk_size => 3)")
    await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)
    await ferry.unsubscribe("gone")
    assert await _run(conn, backfill) == (
        "failed: the backfill's target webhook:gone is gone (its subscription or consumer was removed) (SQLSTATE 55000)"
    )


async def test_rows_hidden_by_row_level_security_are_refused_not_skipped(conn: asyncpg.Connection) -> None:
    """Capture sees every row; a backfill under a policy read 0 of 3,000 rows and said done (outside probe)."""
    owner = f"rls_owner_{os.getpid()}"
    await conn.execute(f"create role {owner}")
    await conn.execute("create table t (id int primary key, tenant text)")
    await conn.execute("insert into t select g, 'a' from generate_series(1, 10) g")
    await conn.execute("select ferry.capture_table('t')")
    await conn.execute(f"alter table t owner to {owner}; grant usage on schema ferry to {owner}")
    await conn.execute("alter table t enable row level security")
    await conn.execute("create policy only_b on t using (tenant = 'b')")
    backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 3)")  # a superuser sees every row
    await conn.execute("alter table t force row level security")
    await conn.execute(f"grant all on all tables in schema ferry to {owner}; grant all on all sequences in schema "
                       f"ferry to {owner}; set role {owner}")  # fmt: skip
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security hides rows of t"):
            await conn.fetchval("select ferry.backfill('t')")
        assert await _run(conn, backfill) == (
            f"failed: row-level security hides rows of public.t from role {owner}, so a backfill would miss them; "
            "run it as the table's owner (without FORCE ROW LEVEL SECURITY) or a role with BYPASSRLS (SQLSTATE 42501)"
        )
    finally:
        await conn.execute("reset role")


async def test_a_chunk_waits_at_most_a_second_for_a_locked_row_and_keeps_the_backfill_running(
    conn: asyncpg.Connection, db_url: str
) -> None:
    """Waiting on one row, a chunk held its share locks on every row before it: an idle transaction
    made writers of other rows of the chunk wait as long (outside probe: 23 s)."""
    await conn.execute("create table t (id int primary key, v int)")
    await conn.execute("insert into t select g, 0 from generate_series(1, 10) g")
    await conn.execute("select ferry.capture_table('t')")
    backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 10)")
    holder = await db.connect(db_url)
    try:
        await holder.execute("begin; update t set v = 1 where id = 7")
        started = asyncio.get_running_loop().time()
        with pytest.raises(asyncpg.LockNotAvailableError):
            await conn.fetch("select * from ferry.backfill_chunk($1)", backfill)
        assert asyncio.get_running_loop().time() - started < 5
        assert await conn.fetchval("select state from ferry.backfills where id = $1", backfill) == "running"
        await holder.execute("rollback")
        assert await _run(conn, backfill) == "done"
    finally:
        await holder.close()


async def test_a_backfill_for_every_reader_fails_when_its_table_is_captured_into_another_stream_midway(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Its rows would be split over two streams, whole in neither (outside probe: done, 3,000 rows,
    820 of them in one stream and the rest in the other)."""
    backfill = await _one_chunk_in(conn)
    await conn.execute("select ferry.capture_table('t', stream => 'other')")
    assert await _run(conn, backfill) == (
        "failed: public.t is now captured into stream 'other', not 'public.t' where the rows up to "
        '{"id": "3"} went; start a new backfill (from the first row) for the new stream (SQLSTATE 55000)'
    )
    assert await conn.fetchval("select count(*) from ferry.events where stream = 'other' and op = 'R'") == 0


async def test_read_events_follow_the_captures_condition_and_column_choice_like_captured_rows(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """A READ carries what an INSERT of the row would have: only rows the capture's condition keeps,
    without the excluded columns (PII never reaches the log through a backfill either)."""
    await conn.execute("create table orders (id int primary key, status text, card_token text)")
    await conn.execute(
        "insert into orders select g, case when g % 3 = 0 then 'paid' else 'open' end, 'tok' || g"
        " from generate_series(1, 30) g"
    )
    await conn.execute(
        "select ferry.capture_table('orders', condition => $$status = 'paid'$$, exclude_columns => array['card_token'])"
    )
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('orders', condition => 'id > 10', chunk_size => 4)")
    assert await _run(conn, backfill) == "done"
    await conn.execute("insert into orders values (31, 'open', 'x'), (33, 'paid', 'y')")  # live, for comparison
    events = await read_all(ferry, conn, "c")
    reads = [e for e in events if e.payload["type"] == "READ"]
    assert [e.key for e in reads] == [str(i) for i in range(12, 31, 3)]  # paid, and id > 10
    assert reads[0].payload["record"] == {"id": 12, "status": "paid"}
    (insert,) = [e for e in events if e.payload["type"] == "INSERT"]
    assert insert.key == "33" and insert.payload["record"].keys() == reads[0].payload["record"].keys()


async def test_a_key_moved_past_the_chunk_while_it_waits_for_the_row_does_not_make_it_skip_rows(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """The chunk's end is picked before its rows are locked: a row an UPDATE gives a far larger key
    while the chunk waits for it is read again under its new key by a later chunk, and the rows
    between are not skipped (a chunk that took its last locked row's key as its end would jump)."""
    await conn.execute("create table items (id int primary key, v text)")
    await conn.execute("insert into items select g, 'v' || g from generate_series(1, 30) g")
    await conn.execute("select ferry.capture_table('items')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('items', chunk_size => 10)")
    mover = await db.connect(db_url)
    runner = await db.connect(db_url)
    try:
        tx = mover.transaction()
        await tx.start()
        await mover.execute("update items set id = 999 where id = 5")  # holds the row until commit
        chunk = asyncio.create_task(runner.fetchrow("select * from ferry.backfill_chunk($1)", backfill))
        await eventually(lambda: _waits_for_a_lock(conn, runner.get_server_pid()), what="the chunk waiting for row 5")
        await tx.commit()
        await chunk
        assert await _run(runner, backfill) == "done"
    finally:
        await mover.close()
        await runner.close()
    events = await read_all(ferry, conn, "c")
    final = {r["id"] for r in await conn.fetch("select id from items")}
    keyed = {int(e.key) for e in events if e.key is not None}
    assert keyed >= final  # every row there has an event: none skipped
    reads = {int(e.key) for e in events if e.key is not None and e.payload["type"] == "READ"}
    assert set(range(6, 31)) <= reads and 999 in reads


async def _waits_for_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    return bool(await conn.fetchval("select wait_event_type = 'Lock' from pg_stat_activity where pid = $1", pid))


async def test_the_estimate_of_rows_exists_for_a_table_never_analyzed_and_bounds_a_condition_from_above(
    conn: asyncpg.Connection,
) -> None:
    """pg_class.reltuples is -1 until a table is analyzed: the progress bar had no total."""
    await conn.execute("create table t (id int primary key, paid boolean)")
    await conn.execute("insert into t select g, g % 10 = 0 from generate_series(1, 50000) g")
    await conn.execute("select ferry.capture_table('t')")
    backfill = await conn.fetchval("select ferry.backfill('t')")
    estimate = await conn.fetchval("select rows_estimate from ferry.backfills where id = $1", backfill)
    assert 25_000 <= estimate <= 100_000, estimate
    await conn.execute("analyze t")
    await conn.execute("select ferry.backfill_cancel($1)", backfill)  # one at a time per table and target
    # The planner guesses 250 rows for id % 2 = 0 (25,000 match): the whole table bounds it instead.
    even = await conn.fetchval("select ferry.backfill('t', condition => 'id % 2 = 0')")
    assert 45_000 <= await conn.fetchval("select rows_estimate from ferry.backfills where id = $1", even) <= 55_000


@pytest.mark.parametrize(
    ("key_type", "keys"),
    [
        ("int[]", ["'{1,2}'", "'{2,3}'", "'{10}'", "'{}'", "'{2,3,4}'"]),
        ("jsonb", ["'\"1\"'", "'1'", "'[2]'", "'{\"a\": 1}'", "'\"b\"'"]),
        ("pair", ["row(1, 'x')", "row(1, 'y')", "row(2, null)", "row(0, 'z')", "row(2, 'a')"]),
        ("char(5)", ["'ab'", "'ab c'", "'a'", "'zz'", "'b'"]),
    ],
)
async def test_keys_of_any_type_are_walked_chunk_after_chunk(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, key_type: str, keys: list[str]
) -> None:
    """An array, jsonb or composite key stored as JSON did not read back as its type: the
    backfill failed at its second chunk."""
    await conn.execute("create type pair as (n int, s text)")
    await conn.execute(f"create table t (k {key_type} primary key, v int)")
    await conn.execute("insert into t values " + ", ".join(f"({k}, {i})" for i, k in enumerate(keys)))
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 2)")
    assert await _run(conn, backfill) == "done"
    got = [e.payload["record"]["v"] for e in await read_all(ferry, conn, "c")]
    expected = [r["v"] for r in await conn.fetch("select v from t order by k")]
    assert got == expected


async def test_a_primary_keys_include_columns_are_not_part_of_the_key(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """pg_index.indkey lists INCLUDE columns after the key's: events and READs were keyed [id, v],
    and every update of v looked like a key change (outside probe)."""
    await conn.execute("create table t (id int, v int, s text, primary key (id) include (v))")
    await conn.execute("insert into t values (1, 1, 'x'), (2, 1, 'y')")
    await conn.execute("select ferry.capture_table('t')")
    assert await conn.fetchval("select key_columns from ferry.captures where uncaptured_at is null") == ["id"]
    await ferry.register_consumer("c")
    await conn.execute("update t set v = v + 1 where id = 1")
    backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 1)")
    assert await _run(conn, backfill) == "done"
    assert [(e.key, e.payload["type"]) for e in await read_all(ferry, conn, "c")] == [
        ("1", "UPDATE"), ("1", "READ"), ("2", "READ"),
    ]  # fmt: skip
    assert await conn.fetchval("select last_key from ferry.backfills") == {"id": "2"}


async def test_a_second_backfill_of_a_table_for_the_same_readers_is_refused_while_one_runs_or_is_paused(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Both were accepted and every row reached the same readers twice (outside probe)."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c", ["public.t"])
    first = await conn.fetchval("select ferry.backfill('t')")
    for_c = await conn.fetchval("select ferry.backfill('t', consumer => 'c')")  # another target: fine
    await conn.execute("select ferry.backfill_pause($1)", first)
    for target, running, who in (("null", first, "every reader"), ("'c'", for_c, "'c'")):
        with pytest.raises(asyncpg.PostgresError, match=f"backfill {running} of t for {who} is") as err:
            await conn.execute(f"select ferry.backfill('t', consumer => {target})")
        assert f"--resume {running}" in (err.value.hint or "") and f"--cancel {running}" in (err.value.hint or "")
    await conn.execute("select ferry.backfill_cancel($1)", first)
    await conn.fetchval("select ferry.backfill('t')")


async def test_one_active_backfill_per_table_and_readers_holds_for_repeatable_read_callers_and_resumes(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """A second outside probe: callers in REPEATABLE READ (a database defaulting to it) took their
    snapshot before the lock, did not see each other's backfill, and both were made (10 of 10); and
    a failed backfill resumed beside one started after it ran with it. Either sent every row twice."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('t')")
    sessions = [await asyncpg.connect(db_url) for _ in range(2)]
    try:
        for s in sessions:  # each snapshot taken before either backfill commits
            await s.execute("begin isolation level repeatable read")
            await s.fetchval("select 1")
        first = await sessions[0].fetchval("select ferry.backfill('t')")
        second = asyncio.ensure_future(sessions[1].fetchval("select ferry.backfill('t')"))
        await asyncio.sleep(0.2)  # waiting for the first one's lock
        await sessions[0].execute("commit")
        with pytest.raises(asyncpg.PostgresError, match="another backfill of t for every reader started at the same"):
            await second
        await sessions[1].execute("rollback")
    finally:
        for s in sessions:
            await s.close()
    assert await conn.fetchval("select count(*) from ferry.backfills where state in ('running', 'paused')") == 1
    # A failed one resumed beside another of the same readers
    await conn.execute("update ferry.backfills set state = 'failed', reason = 'test' where id = $1", first)
    later = await conn.fetchval("select ferry.backfill('t')")
    with pytest.raises(asyncpg.PostgresError, match=f"backfill {first} cannot run again now: another backfill"):
        await conn.execute("select ferry.backfill_resume($1)", first)
    await conn.execute("select ferry.backfill_cancel($1)", later)
    assert await conn.fetchval("select ferry.backfill_resume($1)", first) == "running"
    # Pairs made before migration 0041: the oldest stays active, the others failed, saying why.
    await conn.execute("drop index ferry.backfills_one_active_idx")
    extra = await conn.fetchval(
        "insert into ferry.backfills (capture, relid, schema_name, table_name, chunk_size) "
        "select capture, relid, schema_name, table_name, chunk_size from ferry.backfills where id = $1 returning id",
        first,
    )
    (fix,) = [m for m in sql.migrations() if m.version == 41]
    await conn.execute(fix.sql)
    states = dict(await conn.fetch("select id, state from ferry.backfills where id in ($1, $2)", first, extra))
    assert states == {first: "running", extra: "failed"}
    assert "pgferry 0041" in await conn.fetchval("select reason from ferry.backfills where id = $1", extra)


async def test_a_table_in_an_inheritance_tree_is_captured_with_a_warning_and_backfilled_without_its_children(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """An UPDATE through a parent fires its triggers, not its child's: nothing said so (partitions
    got a NOTICE), and the parent's backfill read the child's rows under keys colliding with its own."""
    await conn.execute("create table parent (id int primary key, x text)")
    await conn.execute("create table kid (y text) inherits (parent)")
    await conn.execute("alter table kid add primary key (id)")
    await conn.execute("insert into parent values (1, 'p'); insert into kid values (1, 'k', 'y'), (2, 'k', 'y')")
    with pytest.warns(CaptureWarning, match="kid inherits from parent: an UPDATE or DELETE through parent"):
        await ferry.capture_table("kid")
    with pytest.warns(CaptureWarning, match=r"parent has inheritance children \(kid, ...\)"):
        await ferry.capture_table("parent")
    await ferry.register_consumer("c", ["public.parent"])
    backfill = await conn.fetchval("select ferry.backfill('parent')")
    assert await _run(conn, backfill) == "done"
    assert [(e.key, e.payload["record"]) for e in await read_all(ferry, conn, "c")] == [("1", {"id": 1, "x": "p"})]


async def test_a_condition_over_a_column_the_record_leaves_out_is_captured_with_a_warning(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """A row leaving such a condition gets a last UPDATE that cannot show it left (outside probe)."""
    await conn.execute("create table t (id int primary key, status text, note text)")
    for columns, excluded in ((None, ["status"]), (["id", "note"], None)):
        with pytest.warns(CaptureWarning, match="the condition of t reads status, which its record leaves out"):
            await ferry.capture_table(
                "t", condition="status = 'active' and id > 0", columns=columns, exclude_columns=excluded
            )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await ferry.capture_table("t", condition="status = 'active'", exclude_columns=["note"])
