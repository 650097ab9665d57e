"""Capture in SQL: ferry.capture_table and ferry.publish inside the writer's transaction."""

import asyncpg
import pytest

import pgferry
from pgferry.errors import CaptureWarning
from tests.helpers import cli, read_all, tick


async def test_capture_insert_update_delete_in_supabase_shape(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await conn.execute("create table public.orders (id int primary key, item text, qty int)")
    assert await conn.fetchval("select ferry.capture_table('public.orders')") == "public.orders"
    await ferry.register_consumer("c")
    await conn.execute("insert into orders values (1, 'spice', 1), (2, 'water', 5)")
    await conn.execute("update orders set qty = qty + 1")
    await conn.execute("delete from orders where id = 2")

    events = await read_all(ferry, conn, "c")
    shapes = [(e.key, e.payload["type"], e.payload["record"], e.payload["old_record"]) for e in events]
    assert shapes == [
        ("1", "INSERT", {"id": 1, "item": "spice", "qty": 1}, None),
        ("2", "INSERT", {"id": 2, "item": "water", "qty": 5}, None),
        ("1", "UPDATE", {"id": 1, "item": "spice", "qty": 2}, {"id": 1, "item": "spice", "qty": 1}),
        ("2", "UPDATE", {"id": 2, "item": "water", "qty": 6}, {"id": 2, "item": "water", "qty": 5}),
        ("2", "DELETE", None, {"id": 2, "item": "water", "qty": 6}),
    ]
    assert all(e.stream == "public.orders" and e.payload["schema"] == "public" for e in events)
    assert all(e.payload["table"] == "orders" for e in events)


async def test_update_pairs_old_and_new_rows_even_when_the_key_changes(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("create table t (id int primary key, v text)")
    await conn.execute("insert into t select g, 'v' || g from generate_series(1, 200) g")
    await conn.execute("select ferry.capture_table('t', stream => 'things')")
    await ferry.register_consumer("c", ["things"])
    await conn.execute("update t set id = id + 1000, v = v || '!'")
    events = await read_all(ferry, conn, "c")
    assert len(events) == 200
    for e in events:
        old, new = e.payload["old_record"], e.payload["record"]
        assert new["id"] == old["id"] + 1000 and new["v"] == old["v"] + "!"
        assert e.key == str(new["id"])


@pytest.mark.parametrize("condition", [None, "r <> 'skip'"])
async def test_a_table_with_columns_named_like_the_generated_aliases_is_captured_whole(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, condition: str | None
) -> None:
    """The generated statements call rows r, n and o; columns of those names must not be taken for
    the row (the record used to be column r alone, and every UPDATE failed with a column n)."""
    await conn.execute("create table t (id int primary key, r text, n int, o int)")
    await conn.execute("select ferry.capture_table('t', condition => $1)", condition)
    await ferry.register_consumer("c")
    await conn.execute("insert into t values (1, 'a', 1, 1)")
    await conn.execute("update t set n = 2, id = 5")
    await conn.execute("delete from t")
    events = await read_all(ferry, conn, "c")
    assert [(e.key, e.payload["record"], e.payload["old_record"]) for e in events] == [
        ("1", {"id": 1, "r": "a", "n": 1, "o": 1}, None),
        ("5", {"id": 5, "r": "a", "n": 2, "o": 1}, {"id": 1, "r": "a", "n": 1, "o": 1}),
        ("5", None, {"id": 5, "r": "a", "n": 2, "o": 1}),
    ]


@pytest.mark.parametrize(
    "options",
    ["", ", condition => $$s <> 'skip'$$", ", changed_columns => array['a', 'h']", ", exclude_columns => array['c']"],
)
async def test_updates_are_captured_after_a_column_is_dropped_and_one_of_another_type_added(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, options: str
) -> None:
    """A whole row of a transition table keeps the slots of dropped columns: taking fields of it
    failed every UPDATE with "attribute 4 has wrong type" (outside probe) until rows went through
    `select *`. Capturing again did not help."""
    await conn.execute("create table t (id int primary key, a int, g text, c text, s text)")
    await conn.execute("insert into t values (1, 1, 'g', 'c', 'x')")
    await conn.execute("alter table t drop column g")
    await conn.execute("alter table t add column h numeric")
    await conn.execute(f"select ferry.capture_table('t'{options})")
    await ferry.register_consumer("c")
    await conn.execute("update t set a = 2, h = 1.5")
    await conn.execute("update t set id = 7, h = 2.5")
    old = {"id": 1, "a": 1, "c": "c", "s": "x", "h": None}
    mid = {**old, "a": 2, "h": 1.5}
    new = {**mid, "id": 7, "h": 2.5}
    if "exclude" in options:
        old, mid, new = ({k: v for k, v in r.items() if k != "c"} for r in (old, mid, new))
    events = await read_all(ferry, conn, "c")
    assert [(e.key, e.payload["record"], e.payload["old_record"]) for e in events] == [
        ("1", mid, old),
        ("7", new, mid),
    ]


async def test_composite_and_explicit_keys(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await conn.execute("create table lines (order_id int, line int, sku text, primary key (order_id, line))")
    await conn.execute("create table nopk (sku text, qty int)")
    await conn.execute("select ferry.capture_table('lines')")
    await conn.execute("select ferry.capture_table('nopk', key_columns => array['sku'])")
    await ferry.register_consumer("c")
    await conn.execute("insert into lines values (7, 2, 'a')")
    await conn.execute("insert into nopk values ('x-1', 3)")
    events = await read_all(ferry, conn, "c")
    assert [(e.stream, e.key) for e in events] == [("public.lines", "[7, 2]"), ("public.nopk", "x-1")]


async def test_rolled_back_writes_leave_no_event(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await conn.execute("create table t (id int primary key)")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    tx = conn.transaction()
    await tx.start()
    await conn.execute("insert into t values (1)")
    await conn.execute("select ferry.publish('s', '{}')")
    await tx.rollback()
    await conn.execute("insert into t values (2)")
    events = await read_all(ferry, conn, "c")
    assert [e.payload["record"]["id"] for e in events] == [2]


async def test_uncapture_and_operations(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await conn.execute("create table t (id int primary key, v int)")
    await conn.execute("select ferry.capture_table('t', operations => array['update'])")
    await ferry.register_consumer("c")
    await conn.execute("insert into t values (1, 1)")
    await conn.execute("update t set v = 2")
    assert await ferry.uncapture_table("t") is True
    assert await ferry.uncapture_table("t") is False  # was not captured any more
    await conn.execute("update t set v = 3")
    events = await read_all(ferry, conn, "c")
    assert [e.payload["type"] for e in events] == ["UPDATE"]
    assert await conn.fetchval("select count(*) from pg_trigger where tgrelid = 't'::regclass") == 0


async def test_capturing_and_uncapturing_say_nothing_on_the_side(conn: asyncpg.Connection) -> None:
    """No NOTICE per call: capturing 200 tables from psql printed three "does not exist, skipping"
    lines each."""
    notices: list[str] = []
    conn.add_log_listener(lambda _, message: notices.append(str(message)))
    await conn.execute("create table t (id int primary key)")
    for _ in range(2):  # first capture, capture again (replaced), then out
        await conn.execute("select ferry.capture_table('t')")
    await conn.execute("select ferry.uncapture_table('t')")
    await conn.execute("select ferry.uncapture_table('t')")
    assert notices == []


async def test_capture_errors_name_the_problem(conn: asyncpg.Connection) -> None:
    await conn.execute("create table nopk (a int)")
    await conn.execute("create view v as select 1 as a")
    with pytest.raises(asyncpg.PostgresError, match="has no primary key") as err:
        await conn.execute("select ferry.capture_table('nopk')")
    assert "key_columns" in (err.value.hint or "")
    with pytest.raises(asyncpg.PostgresError, match="is not a table"):
        await conn.execute("select ferry.capture_table('v')")
    with pytest.raises(asyncpg.PostgresError, match="has no column"):
        await conn.execute("select ferry.capture_table('nopk', key_columns => array['nope'])")
    with pytest.raises(asyncpg.PostgresError, match="does not exist"):
        await conn.execute("select ferry.capture_table('missing_table')")
    with pytest.raises(asyncpg.PostgresError, match="unknown operation"):
        await conn.execute(
            "select ferry.capture_table('nopk', key_columns => array['a'], operations => array['truncate'])"
        )
    with pytest.raises(asyncpg.PostgresError, match=r"ferry\.subscriptions is one of pgferry's own tables"):
        await conn.execute("select ferry.capture_table('ferry.subscriptions')")  # it holds signing secrets


async def test_a_partitioned_table_or_a_partition_captured_by_trigger_says_which_writes_it_misses(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, pgferry_cmd: list[str], db_url: str
) -> None:
    """Statement triggers fire on the table a statement names: a partitioned table's miss writes
    that name a partition, a partition's miss writes through its parent (outside probe: silent)."""
    await conn.execute("create table parted (id int primary key) partition by range (id)")
    await conn.execute("create table parted_1 partition of parted for values from (0) to (100)")
    with pytest.warns(CaptureWarning, match="writes that name a partition of parted directly"):
        await ferry.capture_table("parted")
    shown = await cli(pgferry_cmd, db_url, "capture", "parted_1")
    assert shown.returncode == 0 and shown.stderr.startswith(
        "warning: parted_1 is a partition of parted: writes through parted are not captured by its triggers"
    ), shown.stderr
    assert await conn.fetchval("select ferry._capture_note('parted', 'wal')") is None  # the WAL sees them all
    await conn.execute("create table loose (id int primary key)")
    not_captured = await cli(pgferry_cmd, db_url, "capture", "loose", "--remove")
    assert not_captured.returncode == 1 and "loose is not captured" in not_captured.stderr, not_captured.stderr
    await ferry.register_consumer("c")
    await conn.execute("insert into parted values (1)")  # parted's trigger sees it, parted_1's does not
    await conn.execute("insert into parted_1 values (2)")  # and the other way round
    assert [(e.stream, e.payload["record"]["id"]) for e in await read_all(ferry, conn, "c")] == [
        ("public.parted", 1),
        ("public.parted_1", 2),
    ]


async def test_writers_never_notify(ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str) -> None:
    """Capture and publish send no notification; only a tick does, once."""
    listener = await asyncpg.connect(db_url)
    received: list[str] = []
    await listener.add_listener("pgferry_tick", lambda *args: received.append(args[3]))
    try:
        await conn.execute("create table t (id int primary key)")
        await conn.execute("select ferry.capture_table('t')")
        for i in range(20):
            await conn.execute("insert into t values ($1)", i)
            await conn.execute("select ferry.publish('s', '{}')")
        await listener.execute("select 1")  # flush pending notifications
        assert received == []
        tick_id = await tick(conn)
        await listener.execute("select 1")
        assert received == [str(tick_id)]
    finally:
        await listener.close()


async def test_captures_are_recorded_and_events_keep_the_names_they_were_written_under(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Rows are stored compactly; the envelope is rebuilt at read time from ferry.captures."""
    await conn.execute("create schema shop")
    await conn.execute("create table shop.orders (id int primary key)")
    await conn.execute("select ferry.capture_table('shop.orders', stream => 'orders', operations => array['INSERT'])")
    await ferry.register_consumer("c", ["orders"])
    await conn.execute("insert into shop.orders values (1)")
    await conn.execute("select ferry.capture_table('shop.orders', stream => 'orders')")  # again: replaces the first
    await conn.execute("insert into shop.orders values (2)")
    await conn.execute("select ferry.uncapture_table('shop.orders')")
    await conn.execute("alter table shop.orders rename to orders_old")
    captures = await conn.fetch(
        "select schema_name, table_name, stream, operations, uncaptured_at is not null as gone "
        "from ferry.captures order by id"
    )
    assert [tuple(r) for r in captures] == [
        ("shop", "orders", "orders", ["insert"], True),
        ("shop", "orders", "orders", ["delete", "insert", "update"], True),
    ]
    assert await conn.fetchval("select count(*) from pg_proc where proname ~ '^_capture_[0-9]'") == 0

    events = await read_all(ferry, conn, "c")
    assert [(e.payload["schema"], e.payload["table"], e.payload["record"]["id"]) for e in events] == [
        ("shop", "orders", 1),
        ("shop", "orders", 2),
    ]


async def test_rows_stored_with_their_whole_envelope_are_read_unchanged(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Capture functions from before migration 0003 stored the envelope itself (op is NULL): read as stored."""
    envelope = '{"type": "INSERT", "schema": "public", "table": "t", "record": {"id": 1}, "old_record": null}'
    await ferry.register_consumer("c")
    await conn.execute("select ferry.publish('public.t', $1::text::jsonb, '1')", envelope)
    events = await read_all(ferry, conn, "c")
    assert [e.payload for e in events] == [
        {"type": "INSERT", "schema": "public", "table": "t", "record": {"id": 1}, "old_record": None}
    ]


async def test_the_capture_of_a_dropped_table_ends_at_the_next_housekeeping(conn: asyncpg.Connection) -> None:
    """DROP TABLE calls no pgferry function: status listed a table made, captured and dropped 9 times
    as captured 9 times (outside probe)."""
    for name in ("gone", "kept"):
        await conn.execute(f"create table {name} (id int primary key)")
        await conn.execute(f"select ferry.capture_table('{name}')")
    await conn.execute("drop table gone")
    assert "capture: table public.gone was dropped: its capture (trigger) ended" in await conn.fetchval(
        "select ferry.housekeeping()"
    )
    assert await conn.fetchval("select array_agg(table_name) from ferry.captures where uncaptured_at is null") == [
        "kept"
    ]
    assert not any("dropped" in line for line in await conn.fetchval("select ferry.housekeeping()"))
