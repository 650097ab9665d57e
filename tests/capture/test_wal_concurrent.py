"""WAL capture while other sessions write: the first capture, switches between capture methods,
partitions, and databases whose DateStyle and TimeZone are not the defaults (outside probe)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest

import pgferry
from tests.capture.conftest import Running
from tests.helpers import read_all


@contextlib.asynccontextmanager
async def writing(db_url: str, statements: list[str], writers: int = 2) -> AsyncIterator[list[int]]:
    """``writers`` sessions each running ``statements`` (formatted with i: a number of their own,
    and w: the writer) in one transaction after another until the block ends; yields the list
    of the i of every committed transaction."""
    done: list[int] = []
    stop = asyncio.Event()

    async def write(w: int) -> None:
        conn = await asyncpg.connect(db_url)
        try:
            i = w
            while not stop.is_set():
                async with conn.transaction():
                    for statement in statements:
                        await conn.execute(statement.format(i=i, w=w))
                done.append(i)
                i += writers
                await asyncio.sleep(0.001)
        finally:
            await conn.close()

    tasks = [asyncio.create_task(write(w)) for w in range(writers)]
    try:
        yield done
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_the_first_wal_capture_while_another_table_is_written_captures_from_then_on(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, wal: Running
) -> None:
    """The slot and the publication were made in one transaction: a change committed between the
    two was decoded before the publication existed and decoding stopped there for good."""
    await conn.execute("create table busy (id int primary key, w int); create table cap (id int primary key)")
    async with writing(db_url, ["insert into busy values ({i}, {w})"]):
        await asyncio.sleep(0.2)
        await ferry.capture_table("cap", method="wal")
        await ferry.register_consumer("c", ["public.cap"])
        await conn.execute("insert into cap values (1)")
        await asyncio.sleep(0.2)
    await wal.caught_up(conn)
    assert [e.payload["record"] for e in await read_all(ferry, conn, "c")] == [{"id": 1}]


async def test_switching_methods_while_writers_write_loses_and_doubles_nothing(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, wal: Running
) -> None:
    """A writer's transaction that began before a switch and wrote after the old capture's end was
    caught by neither capture (lost inserts and updates), until capture_table locked the table."""
    await conn.execute("create table sw (id int primary key, w int, v int)")
    await ferry.capture_table("sw", method="wal")
    await ferry.register_consumer("c", ["public.sw"])
    statements = ["insert into sw values ({i}, {w}, 0)", "update sw set v = v + 1 where id = {i}"]
    rng = random.Random(7)
    async with writing(db_url, statements) as committed:
        for method in ["trigger", "wal", "wal", "trigger", "wal", "trigger", "trigger", "wal"]:
            await asyncio.sleep(rng.uniform(0.05, 0.25))
            options = {"condition": "v >= 0"} if rng.random() < 0.5 else {}
            await ferry.capture_table("sw", method=method, **options)
        await asyncio.sleep(0.1)
    await wal.caught_up(conn)
    events = await read_all(ferry, conn, "c")
    got = sorted((e.payload["type"], e.payload["record"]["id"]) for e in events)
    assert got == sorted([("INSERT", i) for i in committed] + [("UPDATE", i) for i in committed])


@pytest.mark.filterwarnings("ignore::pgferry.errors.CaptureWarning")  # the trigger side writes through the parent
async def test_a_partitioned_table_from_the_wal_has_whole_old_rows_as_with_triggers(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, wal: Running
) -> None:
    """Only the partitioned table was set to REPLICA IDENTITY FULL: its partitions' UPDATEs came
    without old_record, DELETEs with nulls outside the key, unchanged TOASTed values left out."""
    big = "(select string_agg(md5(g::text), '') from generate_series(1, 500) g)"
    for t, method in (("pt", "trigger"), ("pw", "wal")):
        await conn.execute(f"create table {t} (id int, region text, note text, big text, primary key (id, region))"
                           " partition by list (region)")  # fmt: skip
        await conn.execute(f"create table {t}_eu partition of {t} for values in ('eu')")
        await conn.execute(f"create table {t}_us partition of {t} for values in ('us')")
        await ferry.capture_table(t, stream=t, method=method)
        await ferry.register_consumer(t, [t])
        await conn.execute(f"insert into {t} values (1, 'eu', 'a', {big}), (2, 'us', 'b', 'small')")
        await conn.execute(f"update {t} set note = 'changed'")
        await conn.execute(f"delete from {t} where id = 2")
    assert await conn.fetchval(
        "select count(*) from pg_class where relname in ('pw_eu', 'pw_us') and relreplident = 'f'"
    ) == 2  # fmt: skip
    await wal.caught_up(conn)

    def seen(events: list[pgferry.Event]) -> list[str]:
        return sorted(orjson.dumps([e.payload[f] for f in ("type", "record", "old_record")],
                                   option=orjson.OPT_SORT_KEYS).decode() for e in events)  # fmt: skip

    by_trigger = await read_all(ferry, conn, "pt")
    assert len(by_trigger) == 5
    assert seen(await read_all(ferry, conn, "pw")) == seen(by_trigger)


async def test_values_are_read_exactly_whatever_the_databases_datestyle_and_timezone(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """Under DateStyle 'SQL, DMY' and TimeZone Asia/Kolkata the server wrote '... IST' in the
    changes it decoded, which was read back as Israel time: 3.5 hours off."""
    database = await conn.fetchval("select current_database()")
    await conn.execute(f"alter database {database} set datestyle = 'SQL, DMY'")
    await conn.execute(f"alter database {database} set timezone = 'Asia/Kolkata'")
    await conn.execute(f"alter database {database} set intervalstyle = 'sql_standard'")
    for t, method in (("by_trigger", "trigger"), ("by_wal", "wal")):
        await conn.execute(f"create table {t} (id int primary key, at timestamptz, d date, span interval, f float8)")
        await ferry.capture_table(t, stream=t, method=method)
        await ferry.register_consumer(t, [t])
    async with Running(db_url) as wal:
        writer = await asyncpg.connect(db_url)  # a session with the database's settings
        try:
            for t in ("by_trigger", "by_wal"):
                await writer.execute(
                    f"insert into {t} values (1, '2026-12-02 10:00+00', '2026-03-04', '1 day 02:03:04', 0.1)"
                )
        finally:
            await writer.close()
        await wal.caught_up(conn)
    by_trigger = [e.payload["record"] for e in await read_all(ferry, conn, "by_trigger")]
    by_wal = [e.payload["record"] for e in await read_all(ferry, conn, "by_wal")]
    assert by_trigger[0]["at"] == "2026-12-02T15:30:00+05:30"
    assert by_wal == by_trigger


async def test_a_capture_change_waits_for_a_transaction_holding_the_table_only_so_long(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """capture_table locks the table; a writer idle in its transaction must not make it (and every
    writer queued behind it) wait without end: an error saying what holds it, and nothing changed."""
    await conn.execute("create table held (id int primary key); create table other (id int primary key)")
    await ferry.capture_table("held")
    idle = await asyncpg.connect(db_url)
    try:
        await idle.execute("begin; insert into held values (1)")  # and then nothing
        await conn.execute("set lock_timeout = '300ms'")
        # The first WAL capture makes the slot, which waits for every transaction in progress.
        with pytest.raises(asyncpg.LockNotAvailableError, match="waits for every transaction in progress"):
            await conn.execute("select ferry.capture_table('other', method => 'wal')")
        await idle.execute("commit")
        await ferry.capture_table("other", method="wal")
        await idle.execute("begin; insert into held values (2)")
        with pytest.raises(asyncpg.LockNotAvailableError, match="held by another transaction") as caught:
            await conn.execute("select ferry.capture_table('held', method => 'wal')")
        assert "pg_stat_activity" in (caught.value.hint or "")
        assert await conn.fetchval("select current_setting('lock_timeout')") == "300ms"
        await conn.execute("reset lock_timeout")
    finally:
        await idle.close()
    assert (
        await conn.fetchval(
            "select method from ferry.captures where relid = 'held'::regclass and uncaptured_at is null"
        )
        == "trigger"
    )
