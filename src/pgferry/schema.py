"""Installing and checking the ferry schema.

``install`` applies the versioned migrations not applied yet, then re-applies
every function file (``sql/functions/``, each after those it calls), then the
same for every add-on asked for or already installed (such as the
pg_net-compatible API), all in one transaction under an advisory lock: running
it twice, or from two processes at once, is safe, and afterwards the functions
are exactly what the files say, whatever was changed by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg

from pgferry import db, sql
from pgferry.errors import PgferryError, SchemaMissing, one_line

log = logging.getLogger(__name__)

#: classid of pgferry's own advisory locks ("pf"): install 1, ticker 2, relay presence 3, tick 4,
#: WAL capture 5 (relay.leader), apply 6 (ops.apply).
LOCK_CLASS = 0x7066
#: classid of consumer ownership locks ("pg"), objid hashtext(consumer name): kept apart
#: so that no consumer name can hash onto one of the fixed locks above.
CONSUMER_LOCK_CLASS = 0x7067
INSTALL_LOCK = 1
#: objid of the shared advisory lock every relay's ownership connection holds.
PRESENCE_LOCK = 3
#: The first migration relays of older code cannot run past: 0016 replaced ferry.webhook_step, the
#: read-and-acknowledge call of every relay before it, by the fenced ferry.webhook_steps. Such
#: relays, left running through an upgrade, failed every delivery until stopped, and one that
#: had sent a batch as the install committed could not record it: it went out twice (outside
#: probe). Later migrations keep older relays working (new parameters are defaulted and last).
RELAYS_BREAK_AT = 16
#: Attempts at an install that a relay's lock on ferry's tables deadlocked or timed out.
INSTALL_ATTEMPTS = 5
#: Names of the functions pgferry generates at run time, not from files: a trigger capture's
#: (ferry.capture_table). Every other function of the ferry schema comes from a file.
GENERATED = r"^_capture_\d+"


async def install(conn: asyncpg.Connection, addons: Sequence[str] = ()) -> list[str]:
    """Apply every migration not yet applied and every function file; return the migrations applied."""
    unknown = sorted(set(addons) - set(sql.ADDONS))
    if unknown:
        raise PgferryError(f"unknown add-on(s) {', '.join(unknown)}; available: {', '.join(sql.ADDONS)}")
    await _require_utf8(conn)
    applied_now: list[str] = []
    async with conn.transaction():
        await conn.execute(sql.query("install_lock"), LOCK_CLASS, INSTALL_LOCK)
        await conn.execute(sql.query("create_migrations_table"))
        await _refuse_newer_schema(conn)
        await _refuse_old_relays(conn)
        applied_now += await _apply(conn, None)
        before = await _function_versions(conn)
        await _define_functions(conn, None, before)
        await conn.execute(sql.query("create_addon_migrations_table"))
        installed = {row["addon"] for row in await conn.fetch(sql.query("installed_addons"))}
        for addon in sorted(installed.union(addons) & set(sql.ADDONS)):  # installed add-ons are upgraded too
            applied_now += await _install_addon(conn, addon)
            await _define_functions(conn, addon, before)
        await _drop_stale_functions(conn, before)
    await _regenerate_trigger_captures(conn)
    return applied_now


async def _regenerate_trigger_captures(conn: asyncpg.Connection) -> None:
    """Regenerate the trigger captures an earlier generator made, after the install committed, one
    transaction each (ferry._regenerate_trigger_capture): the code capture_table generates per table
    is data the function files do not replace."""
    for row in await conn.fetch(sql.query("stale_trigger_captures")):
        async with conn.transaction():
            error = await conn.fetchval(sql.query("regenerate_trigger_capture"), row["id"])
        if error is None:
            log.info("install: regenerated the trigger capture of %s with this version's code", row["tbl"])
        else:
            log.warning("install: the trigger capture of %s was made by an earlier pgferry and could not be "
                        "regenerated (%s); it keeps its old code: run ferry.capture_table for it again",
                        row["tbl"], error)  # fmt: skip


async def _function_versions(conn: asyncpg.Connection) -> dict[int, tuple[str, str]]:
    """oid -> (the row version of its catalog entry, its schema-qualified name), for every function
    of pgferry's schemas but the generated ones: CREATE OR REPLACE writes a new row version, so one
    still the same after the files were applied is one no file defines any more."""
    rows = await conn.fetch(sql.query("function_versions"), GENERATED)
    return {row["oid"]: (row["version"], row["name"]) for row in rows}


async def _require_utf8(conn: asyncpg.Connection) -> None:
    """Events are JSON, which is Unicode: in a LATIN1 database install failed on a character of a
    function's comment, and in a SQL_ASCII one (which stores any bytes) a captured row with one
    byte that is not UTF-8 stopped every subscription reading it, for good (outside probe)."""
    encoding = await conn.fetchval(sql.query("database_encoding"))
    if encoding != "UTF8":
        raise PgferryError(
            f"this database's encoding is {encoding}, and pgferry needs UTF8 (events are JSON text): install it "
            "into a database created with ENCODING 'UTF8' (createdb --encoding UTF8 --template template0 ...)"
        )


async def _refuse_newer_schema(conn: asyncpg.Connection) -> None:
    """Refuse to install over a schema a newer pgferry installed: this code's function files would
    replace the newer ones under the relays that need them, and leave overloads its install cannot
    see (an older install over a newer schema said "already up to date", rewrote 19 functions, and
    `ferry.backfill_resume` became "not unique"; outside probe)."""
    version = await conn.fetchval(sql.query("schema_version"))
    newer = [f"the schema at version {version}"] if version is not None and version > sql.latest_version() else []
    if await conn.fetchval(sql.query("addon_migrations_table_exists")):
        for row in await conn.fetch(sql.query("installed_addons")):
            mine = sql.migrations(row["addon"])[-1].version if row["addon"] in sql.ADDONS else 0
            if row["version"] > mine:
                newer.append(f"its {row['addon']} add-on at version {row['version']}")
    if newer:
        raise PgferryError(
            f"this database was installed by a newer pgferry ({' and '.join(newer)}; this pgferry knows "
            f"{sql.latest_version()}): installing this older one would put older functions under relays that "
            "need the newer ones. Nothing was changed; run `pgferry install` of the newer version, or none"
        )


async def _refuse_old_relays(conn: asyncpg.Connection) -> None:
    """Refuse to take a schema older than RELAYS_BREAK_AT past it while relays are connected: on
    such a schema they run older code (newer code refuses an older schema), which cannot run on
    the new one."""
    version = await conn.fetchval(sql.query("schema_version"))
    if version is None or version >= RELAYS_BREAK_AT:
        return
    relays = await conn.fetch(sql.query("relays_present"), LOCK_CLASS, PRESENCE_LOCK)
    if relays:
        reported = relays[0]["reported"]
        raise PgferryError(
            f"{len(relays)} relay(s) are connected{f' ({reported})' if reported else ''}, running code of schema "
            f"version {version}: from migration {RELAYS_BREAK_AT:04d} on, relays that old cannot deliver (every "
            "batch would fail, and one sent as the install commits would be sent again). Stop them, run "
            '`pgferry install` again, then start relays of this version (docs/operations.md, "Upgrading")'
        )


async def _install_addon(conn: asyncpg.Connection, addon: str) -> list[str]:
    if addon == "pg_net":
        if await conn.fetchval(sql.query("pg_net_extension_installed")):
            raise PgferryError(
                "the pg_net extension is installed in this database, and pgferry's pg_net-compatible API needs "
                "the `net` schema for itself. Move pending work off it, then `drop extension pg_net` and run "
                "`pgferry install --pg-net` again (see docs/migrating-from-pg_net.md)."
            )
        if await conn.fetchval(sql.query("foreign_net_schema")):
            raise PgferryError(
                "a schema named `net` already exists and was not created by pgferry; "
                "rename or drop it before `pgferry install --pg-net`"
            )
    return await _apply(conn, addon)


async def _define_functions(conn: asyncpg.Connection, addon: str | None, before: dict[int, tuple[str, str]]) -> None:
    """(Re)create every function of the core (or an add-on) from its file: every install does,
    after the migrations, so what runs is always what the files say.

    CREATE OR REPLACE cannot rename a parameter or change a return type: a function file changed
    so (ferry._full_xid's parameter renamed) made every install of a database that had the old one
    fail, for good (outside probe). Then the overloads of that name an older install left are
    dropped and the file applied again, in a savepoint."""
    for function in sql.functions(addon):
        try:
            try:
                async with conn.transaction():
                    await conn.execute(function.sql)
            except asyncpg.InvalidFunctionDefinitionError:
                async with conn.transaction():
                    for oid, (_, name) in before.items():
                        if name == function.name:
                            await conn.execute(await conn.fetchval(sql.query("drop_function_statement"), oid))
                    await conn.execute(function.sql)
        except asyncpg.PostgresError as exc:
            raise PgferryError(f"cannot define {function.name} (sql/functions/{function.name}.sql): {exc}") from exc


async def _drop_stale_functions(conn: asyncpg.Connection, before: dict[int, tuple[str, str]]) -> None:
    """Drop the functions of the ferry schema no file defines any more: overloads an older (or
    newer) install left, which can make a call "not unique" (outside probe: ferry.backfill_resume).
    One that something else depends on stays, with a warning."""
    now = await _function_versions(conn)
    for oid, (version, name) in before.items():
        if now.get(oid, (None,))[0] != version or not name.startswith("ferry."):
            continue
        try:
            async with conn.transaction():
                await conn.execute(await conn.fetchval(sql.query("drop_function_statement"), oid))
            log.info("install: dropped %s, which no function file defines", name)
        except asyncpg.DependentObjectsStillExistError as exc:
            log.warning("install: %s is defined by no function file but kept: %s", name, one_line(exc))


async def _apply(conn: asyncpg.Connection, addon: str | None) -> list[str]:
    """Apply the core's (addon None) or an add-on's migrations not applied yet."""
    if addon is None:
        rows = await conn.fetch(sql.query("applied_migrations"))
    else:
        rows = await conn.fetch(sql.query("applied_addon_migrations"), addon)
    done = {row["version"] for row in rows}
    prefix = "" if addon is None else f"{addon}:"
    applied = []
    for migration in sql.migrations(addon):
        if migration.version in done:
            continue
        name = f"{prefix}{migration.version:04d}_{migration.name}"
        log.info("applying migration %s", name)
        if not migration.empty:
            await conn.execute(migration.sql)
        if addon is None:
            await conn.execute(sql.query("record_migration"), migration.version, migration.name)
        else:
            await conn.execute(sql.query("record_addon_migration"), addon, migration.version, migration.name)
        applied.append(name)
    return applied


async def install_at(url: str, addons: Sequence[str] = ()) -> list[str]:
    """``install`` over a connection of its own, again when a relay's locks deadlocked with it or
    made it time out (it rolled back whole): a migration altering ferry's tables locks them in
    another order than a relay's statements (2 of 7 live upgrades deadlocked; outside probe)."""
    conn = await db.connect(url)
    try:
        return await db.again_if_rolled_back(
            lambda: install(conn, addons), "install", also=(asyncpg.LockNotAvailableError,), tries=INSTALL_ATTEMPTS
        )
    except (*db.ROLLED_BACK, asyncpg.LockNotAvailableError) as exc:
        raise PgferryError(
            f"install rolled back {INSTALL_ATTEMPTS} times, waiting for locks that running relays or other "
            f"sessions hold on ferry's tables ({one_line(exc)}); nothing was changed. Run it again, "
            "or stop the relays while it runs"
        ) from None
    except asyncpg.InsufficientPrivilegeError as exc:
        raise PgferryError(_install_refused(exc)) from None
    except asyncpg.PostgresError as exc:
        raise PgferryError(f"install failed, and rolled back whole: {one_line(exc)}") from None
    finally:
        await conn.close()


def _install_refused(exc: asyncpg.InsufficientPrivilegeError) -> str:
    """Why install was refused, with who may install: not ferry_relay, which the operator commands'
    own permission errors ask for (a role that may not create the schema got asyncpg's traceback)."""
    if exc.message.startswith("pgferry:"):  # a migration's own refusal carries its hint
        return one_line(exc)
    return (
        f"{exc.message}; installing takes a role that may create a schema in the database (its owner, or "
        "one granted CREATE on it), and upgrading the role that owns the ferry schema: run install as that role"
    )


async def check_installed(conn: asyncpg.Connection) -> int:
    """Return the installed schema version, or raise SchemaMissing with the fix."""
    installed = await conn.fetchval(sql.query("schema_installed"))
    version = await conn.fetchval(sql.query("schema_version")) if installed else None
    database = await conn.fetchval(sql.query("current_database"))
    if version is None:
        raise SchemaMissing(
            f"the pgferry schema is not installed in database {database!r}; "
            "run `pgferry install --database-url URL` first"
        )
    if version < sql.latest_version():
        raise SchemaMissing(
            f"the pgferry schema in database {database!r} is at version {version}, "
            f"this pgferry needs {sql.latest_version()}; run `pgferry install --database-url URL` to upgrade"
        )
    for row in await conn.fetch(sql.query("installed_addons")):
        latest = sql.migrations(row["addon"])[-1].version if row["addon"] in sql.ADDONS else row["version"]
        if row["version"] < latest:
            raise SchemaMissing(
                f"pgferry's {row['addon']} add-on in database {database!r} is at version {row['version']}, "
                f"this pgferry needs {latest}; run `pgferry install --database-url URL` to upgrade"
            )
    return int(version)
