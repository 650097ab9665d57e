"""Installing a released pgferry schema as it shipped, to test upgrades from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from pgferry import sql

RELEASED = Path(__file__).parent / "released"


@dataclass(frozen=True)
class Release:
    commit: str
    core: int  # the newest core migration it shipped
    pg_net: int  # the newest pg_net add-on migration (0: no add-on yet)

    def __str__(self) -> str:
        return self.commit


#: The oldest release whose migrations were never edited afterwards, and the last one before
#: functions moved into files.
RELEASES = (Release("61fe2f8", core=6, pg_net=3), Release("2ced9d6", core=7, pg_net=3))


async def install_release(conn: asyncpg.Connection, release: Release, *, pg_net: bool = True) -> None:
    """What `pgferry install [--pg-net]` of ``release`` did: its migrations, recorded the same way."""
    core = _read(sorted((RELEASED / "migrations").glob("*.sql"))[: release.core])
    addon = _read(sorted((RELEASED / "addons" / "pg_net").glob("*.sql"))[: release.pg_net]) if pg_net else []
    async with conn.transaction():
        await conn.execute(sql.query("create_migrations_table"))
        for path, text in core:
            await _apply(conn, path, text, None)
        await conn.execute(sql.query("create_addon_migrations_table"))
        for path, text in addon:
            await _apply(conn, path, text, "pg_net")


def _read(paths: list[Path]) -> list[tuple[Path, str]]:
    return [(path, path.read_text()) for path in paths]


async def _apply(conn: asyncpg.Connection, path: Path, text: str, addon: str | None) -> None:
    version, name = int(path.name[:4]), path.stem[5:]
    await conn.execute(text)
    if addon is None:
        await conn.execute(sql.query("record_migration"), version, name)
    else:
        await conn.execute(sql.query("record_addon_migration"), addon, version, name)


#: Functions capture_table generates per table: data, not part of the schema's contract.
GENERATED = r"^_capture_\d+"


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
