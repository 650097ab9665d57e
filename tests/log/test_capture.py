"""Capture in SQL: ferry.capture_table and ferry.publish inside the writer's transaction."""

import asyncpg
import pytest

import pgferry
from tests.helpers import read_all, tick


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
    await conn.execute("select ferry.uncapture_table('t')")
    await conn.execute("update t set v = 3")
    events = await read_all(ferry, conn, "c")
    assert [e.payload["type"] for e in events] == ["UPDATE"]
    assert await conn.fetchval("select count(*) from pg_trigger where tgrelid = 't'::regclass") == 0


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
