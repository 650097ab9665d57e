"""Installing a released pgferry schema as it shipped, to test upgrades from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from pgferry import sql
from pgferry.schema import GENERATED

RELEASED = Path(__file__).parent / "released"


@dataclass(frozen=True)
class Release:
    commit: str
    core: int  # the newest core migration it shipped
    pg_net: int  # the newest pg_net add-on migration (0: no add-on yet)
    #: the frozen copy it installs from, released/<files>/ (default: its own commit). The releases
    #: before the move share the last one's copy: each shipped a prefix of those migrations.
    files: str = ""

    def __str__(self) -> str:
        return self.commit

    @property
    def folder(self) -> Path:
        return RELEASED / (self.files or self.commit)


#: The oldest release whose migrations were never edited afterwards; the last one before functions
#: moved into files (36d660b: its migrations 0001-0008 and pg_net's 0001-0004 define the functions);
#: and one after the move (5470897: migrations 0001-0023, every function in its own file).
RELEASES = (
    Release("61fe2f8", core=6, pg_net=3, files="36d660b"),
    Release("2ced9d6", core=7, pg_net=3, files="36d660b"),
    Release("36d660b", core=8, pg_net=4),
    Release("5470897", core=23, pg_net=4),
)
#: The newest frozen release: every migration it shipped is the same, byte for byte, today.
NEWEST = RELEASES[-1]


def release(commit: str) -> Release:
    """The frozen release made at ``commit``."""
    return next(r for r in RELEASES if r.commit == commit)


def migrations(release: Release, addon: str | None = None) -> list[Path]:
    """The migration files ``release`` shipped, core or an add-on's, in version order."""
    folder = release.folder / ("migrations" if addon is None else f"addons/{addon}")
    shipped = release.core if addon is None else release.pg_net
    return sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.sql"))[:shipped]


def _read(paths: list[Path]) -> list[sql.Migration]:
    return [sql.Migration(int(path.name[:4]), path.stem[5:], path.read_text()) for path in paths]


async def install_release(conn: asyncpg.Connection, release: Release, *, pg_net: bool = True) -> None:
    """What `pgferry install [--pg-net]` of ``release`` did: its migrations, recorded the same way,
    then (a release after the move) every one of its function files, core first, in call order."""
    core, functions = _read(migrations(release)), sql.read_functions(release.folder / "functions")
    addon = _read(migrations(release, "pg_net"))
    addon_functions = sql.read_functions(release.folder / "addons" / "pg_net" / "functions")
    async with conn.transaction():
        await conn.execute(sql.query("create_migrations_table"))
        for migration in core:
            await _apply(conn, migration, None)
        for function in functions:
            await conn.execute(function.sql)
        if not pg_net:
            return
        await conn.execute(sql.query("create_addon_migrations_table"))
        for migration in addon:
            await _apply(conn, migration, "pg_net")
        for function in addon_functions:
            await conn.execute(function.sql)


async def _apply(conn: asyncpg.Connection, migration: sql.Migration, addon: str | None) -> None:
    if not migration.empty:  # its functions moved to files: only comments left
        await conn.execute(migration.sql)
    if addon is None:
        await conn.execute(sql.query("record_migration"), migration.version, migration.name)
    else:
        await conn.execute(sql.query("record_addon_migration"), addon, migration.version, migration.name)


async def catalog(conn: asyncpg.Connection) -> dict[str, Any]:
    """What a schema is, for comparing two installs: functions and their definitions, tables,
    columns, constraints, indexes, triggers, types, and who may do what."""
    schemas = ["ferry", "net", "supabase_functions"]
    roles = ["ferry_writer", "ferry_relay", "pgferry_nobody"]
    functions = await conn.fetch(
        """select n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' as id,
                  pg_get_functiondef(p.oid) as def,
                  array(select has_function_privilege(r, p.oid, 'execute') from unnest($2::text[]) r) as may
           from pg_proc p join pg_namespace n on n.oid = p.pronamespace
           where n.nspname = any($1) and p.proname !~ $3 order by 1""",
        schemas, roles, GENERATED,
    )  # fmt: skip
    # Columns by name, not position: a column a core migration adds to a table an add-on also
    # extends comes after the add-on's in an upgraded database and before it in a fresh one
    # (ferry.subscriptions: pg_net's kind, 0012's filter). pgferry reads every column by name.
    columns = await conn.fetch(
        """select c.table_schema || '.' || c.table_name as t, c.column_name, c.data_type, c.is_nullable,
                  c.column_default
           from information_schema.columns c where c.table_schema = any($1) order by 1, 2""",
        schemas,
    )
    constraints = await conn.fetch(
        """select conrelid::regclass::text as t, conname, pg_get_constraintdef(oid) as def from pg_constraint
           where connamespace in (select oid from pg_namespace where nspname = any($1)) order by 1, 2""",
        schemas,
    )
    indexes = await conn.fetch(
        "select schemaname, tablename, indexname, indexdef from pg_indexes where schemaname = any($1) order by 1, 2, 3",
        schemas,
    )
    triggers = await conn.fetch(
        """select tgrelid::regclass::text as t, tgname, pg_get_triggerdef(oid) as def from pg_trigger
           where not tgisinternal
             and tgrelid in (select c.oid from pg_class c join pg_namespace n on n.oid = c.relnamespace
                             where n.nspname = any($1)) order by 1, 2""",
        schemas,
    )  # fmt: skip
    tables = await conn.fetch(
        """select n.nspname || '.' || c.relname as t, c.relkind, c.relpersistence,
                  array(select has_table_privilege(r, c.oid, p) from unnest($2::text[]) r,
                        unnest(array['select', 'insert', 'update', 'delete', 'truncate']) p) as may
           from pg_class c join pg_namespace n on n.oid = c.relnamespace
           where n.nspname = any($1) and c.relkind in ('r', 'p', 'v', 'S') order by 1""",
        schemas, roles,
    )  # fmt: skip
    types = await conn.fetch(
        """select n.nspname || '.' || t.typname as t, t.typtype
           from pg_type t join pg_namespace n on n.oid = t.typnamespace left join pg_class c on c.oid = t.typrelid
           where n.nspname = any($1) and t.typtype in ('c', 'd', 'e') and (c.oid is null or c.relkind = 'c')
           order by 1""",
        schemas,
    )
    return {
        "functions": {r["id"]: (r["def"], list(r["may"])) for r in functions},
        "columns": [tuple(r) for r in columns],
        "constraints": [tuple(r) for r in constraints],
        "indexes": [tuple(r) for r in indexes],
        "triggers": [tuple(r) for r in triggers],
        "tables": [tuple(r) for r in tables],
        "types": [tuple(r) for r in types],
    }
