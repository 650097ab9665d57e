import asyncio
import os
import re

import asyncpg
import click
import pytest

from pgferry import db, schema, sql
from pgferry.cli.common import run_coroutine
from pgferry.embedded import EmbeddedPostgres
from pgferry.errors import PgferryError, SchemaMissing
from pgferry.schema import check_installed, install
from tests.helpers import cli


async def test_install_is_idempotent(empty_db_url: str) -> None:
    conn = await db.connect(empty_db_url)
    try:
        with pytest.raises(SchemaMissing, match="pgferry install"):
            await check_installed(conn)
        first = await install(conn)
        assert first == [f"{m.version:04d}_{m.name}" for m in sql.migrations()]
        assert await install(conn) == []
        assert await check_installed(conn) == sql.latest_version()
    finally:
        await conn.close()


async def test_concurrent_installs_apply_each_migration_once(empty_db_url: str) -> None:
    conns = [await db.connect(empty_db_url) for _ in range(4)]
    try:
        results = await asyncio.gather(*(install(c) for c in conns))
        assert sum(len(r) for r in results) == len(sql.migrations())
        count = await conns[0].fetchval("select count(*) from ferry.schema_migrations")
        assert count == len(sql.migrations())
    finally:
        for c in conns:
            await c.close()


async def test_old_schema_version_asks_for_upgrade(db_url: str) -> None:
    conn = await db.connect(db_url)
    try:
        await conn.execute(
            "delete from ferry.schema_migrations where version = (select max(version) from ferry.schema_migrations)"
        )
        with pytest.raises(SchemaMissing, match="upgrade"):
            await check_installed(conn)
    finally:
        await conn.close()


async def test_only_the_ticker_notifies(conn: asyncpg.Connection) -> None:
    """No writer path may NOTIFY (it takes a lock every committing writer would queue on): only
    the tick (ferry._tick_snapshot, under ferry.tick() and the single ticker's ferry._tick_fenced)
    does, ferry._ensure_wal_slot, once, when an operator's capture_table or reset_wal_slot
    creates WAL capture's slot, ferry._skip_to when retention (housekeeping) or an operator's
    resume from now skips events of a consumer (its relay stops sending them), and
    ferry._set_subscription_state when an operator pauses a subscription or its endpoint's 410
    disables it (its relay stops its workers at once), and ferry.subscribe when a subscription is
    made or changed (the relays' next ownership round starts at once)."""
    notifying = await conn.fetch(
        """select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace
           where n.nspname = 'ferry' and p.prosrc ilike '%notify%' order by p.proname"""
    )
    assert [r["proname"] for r in notifying] == [
        "_ensure_wal_slot", "_set_subscription_state", "_skip_to", "_tick_snapshot", "subscribe"
    ]  # fmt: skip


async def test_suite_runs_on_uvloop_like_the_relay() -> None:
    import asyncio

    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")


def test_every_named_query_is_defined_once() -> None:
    """A second definition silently replaced the first (subscription_exists was written twice)."""
    names = re.findall(r"^-- name: (\S+)", sql._read("queries.sql"), re.MULTILINE)
    assert [n for n in set(names) if names.count(n) > 1] == []


async def test_an_install_that_waits_too_long_for_a_lock_tries_again_then_says_so(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration's locks can deadlock with a running relay's (2 of 7 live upgrades; outside
    probe), or time out; install rolls back whole, so it tries again, and in the end says what
    happened in one line instead of asyncpg's traceback."""
    holder = await db.connect(db_url)
    database = await holder.fetchval("select quote_ident(current_database())")
    await holder.execute(f"alter database {database} set lock_timeout = '100ms'")  # for install's new sessions
    try:
        async with holder.transaction():
            await holder.execute("lock table ferry.schema_migrations in access exclusive mode")
            monkeypatch.setattr(schema, "INSTALL_ATTEMPTS", 2)
            with pytest.raises(
                PgferryError, match=r"install rolled back 2 times, waiting for locks .* nothing was changed"
            ):
                await schema.install_at(db_url)
            monkeypatch.setattr(schema, "INSTALL_ATTEMPTS", 5)
            install = asyncio.create_task(schema.install_at(db_url))
            await asyncio.sleep(0.3)  # a try or two roll back
        assert await install == []  # the lock gone, a later try succeeds
    finally:
        await holder.close()


async def test_install_refuses_a_database_that_is_not_utf8(pg: EmbeddedPostgres) -> None:
    """A SQL_ASCII database stores bytes that are not UTF-8, and one such captured row stopped every
    subscription reading it, for good; LATIN1 failed install on a character (outside probe)."""
    name = f"ascii_{os.getpid()}"
    admin = await asyncpg.connect(pg.url)
    try:
        await admin.execute(
            f"create database {name} encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0"
        )
        with pytest.raises(PgferryError, match="encoding is SQL_ASCII, and pgferry needs UTF8"):
            await schema.install_at(pg.url.rsplit("/", 1)[0] + "/" + name)
    finally:
        await admin.execute(f"drop database if exists {name} with (force)")
        await admin.close()


async def test_a_relay_on_read_only_sessions_stops_at_once_saying_why(pgferry_cmd: list[str], db_url: str) -> None:
    """A standby or a role whose sessions default to read-only: the relay connected, then looped on
    errors for good (outside probe). The URL's setting stands in for the role's."""
    read_only = db_url + ("&" if "?" in db_url else "?") + "default_transaction_read_only=on"
    done = await cli(pgferry_cmd, read_only, "run", "--exit-after", "10")
    assert done.returncode == 1, done.stderr
    assert "sessions here are read-only" in done.stderr and "Traceback" not in done.stderr
    status = await cli(pgferry_cmd, read_only, "subscription", "pause", "nothing-here")
    assert status.returncode == 1 and "Traceback" not in status.stderr


def test_serializable_on_a_standby_is_told_as_a_standby_not_with_postgresql_s_hint() -> None:
    """Outside probe: on a standby whose database defaults to serializable every command printed
    PostgreSQL's "cannot use serializable mode in a hot standby ... use repeatable read", which sent
    the operator the wrong way (a unit test: the error as PostgreSQL raises it)."""

    async def refused() -> None:
        raise asyncpg.FeatureNotSupportedError("cannot use serializable mode in a hot standby")

    with pytest.raises(click.ClickException) as said:
        run_coroutine(refused())
    assert "this server is a standby (in recovery)" in said.value.message and "point pgferry at the primary" in (
        said.value.message
    )


def test_a_statement_cancelled_by_the_database_s_timeout_says_how_to_lift_it_for_the_command() -> None:
    """A second outside probe: `pgferry replay` under a database's statement_timeout of 50 ms ended
    in "canceling statement due to statement timeout" and nothing else (a unit test: the error as
    PostgreSQL raises it)."""

    async def cancelled() -> None:
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    with pytest.raises(click.ClickException) as said:
        run_coroutine(cancelled())
    assert "add ?statement_timeout=0&lock_timeout=0 to the database URL" in said.value.message
