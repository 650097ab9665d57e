"""What every benchmark section shares: the scratch database, settings, results and targets."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import click

from pgferry import db
from pgferry.bench.cores import CoreSplit
from pgferry.bench.sqlfiles import query, read
from pgferry.schema import install

#: The scratch database every run creates on the server and drops afterwards,
#: so a benchmark never touches an application's tables or its ferry schema.
BENCH_DATABASE = "pgferry_bench"

SECTIONS = ("inserts", "e2e", "producers", "idle", "wal")


@dataclass(frozen=True)
class BenchSettings:
    sections: tuple[str, ...] = SECTIONS
    clients: tuple[int, ...] = (10, 50)
    rows: tuple[int, ...] = (1, 100)
    seconds: float = 8.0
    rounds: int = 1
    rate: float = 2000.0
    e2e_seconds: float = 20.0
    e2e_clients: int = 10
    publish_tasks: int = 16
    idle_seconds: float = 10.0
    #: the idle section measures again with this many idle subscriptions
    idle_subscriptions: int = 1000
    #: break idle queries down by statement (needs pg_stat_statements preloaded)
    stat_statements: bool = False
    #: also insert into a table captured with a condition and a column list (inserts section)
    filtered: bool = False
    #: the application's side and pgferry's side on their own cores (bench/cores.py; None: not pinned)
    pin: CoreSplit | None = None


@dataclass
class Target:
    """One goal from the design brief and whether this run met it."""

    section: str
    what: str
    goal: str
    measured: str
    met: bool


@dataclass
class BenchContext:
    settings: BenchSettings
    admin_url: str
    url: str
    server: dict[str, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    _checkpoint_allowed: bool = True

    @staticmethod
    def progress(message: str) -> None:
        """Progress goes to stderr so stdout holds only the tables."""
        click.echo(message, err=True)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await db.connect(self.url)
        try:
            yield conn
        finally:
            await conn.close()

    async def checkpoint(self, conn: asyncpg.Connection) -> None:
        """Flush dirty pages now, so no cell pays for an earlier cell's checkpoint."""
        if not self._checkpoint_allowed:
            return
        try:
            await conn.execute(query("checkpoint"))
        except asyncpg.InsufficientPrivilegeError:
            self._checkpoint_allowed = False
            self.progress("warning: not allowed to CHECKPOINT (needs superuser or pg_checkpoint); cells may drift")

    def target(self, section: str, what: str, goal: str, measured: str, met: bool) -> None:
        self.targets.append(Target(section, what, goal, measured, met))


def database_url(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


@contextlib.asynccontextmanager
async def scratch_database(settings: BenchSettings, admin_url: str) -> AsyncIterator[BenchContext]:
    """Create the bench database with the ferry schema and the bench tables; drop it afterwards."""
    admin = await db.connect(admin_url)
    try:
        if urlsplit(admin_url).path.lstrip("/") == BENCH_DATABASE:
            raise click.UsageError(
                f"give the URL of another database than {BENCH_DATABASE}: it is dropped and re-created"
            )
        try:
            await admin.execute(query("drop_database"))
            await admin.execute(query("create_database"))
        except asyncpg.InsufficientPrivilegeError as exc:
            raise click.ClickException(
                f"cannot (re)create the scratch database {BENCH_DATABASE} ({exc}); the benchmark needs a role "
                "with CREATEDB, and never writes into the URL's own database"
            ) from exc
        if settings.stat_statements:
            await admin.execute(query("create_pg_stat_statements"))
        info = dict(await admin.fetchrow(query("server_info")))
    finally:
        await admin.close()
    ctx = BenchContext(settings=settings, admin_url=admin_url, url=database_url(admin_url, BENCH_DATABASE))
    ctx.server = {
        **{k: str(v) for k, v in info.items()},
        "cpus": str(os.cpu_count()),
        "python": platform.python_version(),
    }
    try:
        async with ctx.connect() as conn:
            await install(conn)
            await conn.execute(read("setup.sql"))
        yield ctx
    finally:
        admin = await db.connect(admin_url)
        try:
            await admin.execute(query("drop_database"))
        finally:
            await admin.close()
