"""What every `pgferry` command shares: the database-url option, running a coroutine,
a Ferry for one command, and printing (rich tables, JSON, escaped text).

A leaf of the CLI package: it imports no sibling, and every command module imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg
import click
import orjson
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table
from rich.text import Text

import pgferry
from pgferry import db, errors, sql
from pgferry.capture.backfill import Progress as BackfillProgress
from pgferry.delivery.signing import redact_secrets
from pgferry.errors import PermissionDenied, PgferryError, one_line
from pgferry.ops.backfill import rows_text
from pgferry.ops.logs import configure

T = TypeVar("T")

console = Console()

database_url_option = click.option(
    "--database-url",
    envvar=db.URL_ENV_VAR,
    metavar="URL",
    help=f"PostgreSQL URL (or set {db.URL_ENV_VAR}).",
)

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def setup_logging(verbose: bool, fmt: str = "human", process: str | None = None) -> None:
    configure(verbose=verbose, fmt=fmt, process=process)


def run_coroutine(coro: Coroutine[Any, Any, Any], *, relay: bool = False, url: str | None = None) -> Any:
    """Run a coroutine, turning pgferry's own errors and a missing privilege (on the database at
    ``url``, whose role the message names) into a one-line exit. A relay runs on uvloop;
    a command that prints its answer runs on asyncio: once uvloop.run has ended, a write to a
    pipe returns after the pipe's 64 KiB and the rest was lost (`pgferry subscription list
    --json | slow-reader` printed 65,536 of 168,687 bytes, exit 0: outside probe)."""
    runner: Any = asyncio.run
    if relay:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
            pass
    try:
        return runner(coro)
    except PermissionDenied as exc:
        raise click.ClickException(permission_denied(exc.denied, url)) from None
    except PgferryError as exc:
        raise click.ClickException(redact_secrets(str(exc))) from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        raise click.ClickException(permission_denied(exc, url)) from None
    except asyncpg.PostgresError as exc:  # the database's own words, not a traceback (outside probe)
        said = f"{redact_secrets(one_line(exc))} (SQLSTATE {exc.sqlstate})"
        if "in a hot standby" in str(exc):
            # A database defaulting to serializable: PostgreSQL's hint (use repeatable read) sent the
            # operator the wrong way, on every command (outside probe).
            said = f"{exc.message} (SQLSTATE {exc.sqlstate}): {db.READ_ONLY_FIX['standby']}"
        elif exc.sqlstate == "25006" or "recovery is in progress" in str(exc):  # a standby, or read-only sessions
            said += f": {db.READ_ONLY_FIX['standby']}; or, if it is not a standby, {db.READ_ONLY_FIX['read_only']}"
        elif "statement timeout" in str(exc) or "lock timeout" in str(exc):
            # A database's or role's statement_timeout cut an operator command (a replay of 100,000
            # events under 50 ms) with no word of what to change (outside probe). A URL parameter
            # asyncpg does not know goes to PostgreSQL as a setting for the session.
            said += (
                ": the database's or role's statement_timeout / lock_timeout cancelled it; for this command, "
                "add ?statement_timeout=0&lock_timeout=0 to the database URL (&... if it has a query already)"
            )
        raise click.ClickException(said) from None


def permission_denied(exc: asyncpg.InsufficientPrivilegeError, url: str | None) -> str:
    """A missing privilege as one line with the fix. Nearly every command reads or writes ferry's
    tables, which a role gets from ferry_relay (docs/security.md, "Privileges"); without it each command ended in
    asyncpg's traceback (outside review). A function's own refusal (``pgferry: ...``, with its
    hint) already says what is missing, and is shown as it is."""
    if exc.message.startswith("pgferry:"):
        return one_line(exc)
    role = _role_of(url)
    grantee = role or "the role of --database-url"
    who = "role " + role if role else "this role"
    denied = _DENIED.match(exc.message)
    if denied is not None and not _is_ferrys(denied["kind"], denied["name"]):
        # Not ferry's own object: a table of the application's (a backfill reads the captured table
        # as the caller). Told to grant ferry_relay, which the role had already (outside probe).
        return (
            f"{exc.message}; {who} may not read the application's {denied['kind']} {denied['name']}: a backfill reads "
            f"the captured table as its caller, who needs USAGE on its schema and SELECT on it (`grant usage on "
            f"schema ... to {grantee}; grant select on ... to {grantee}`) besides ferry_relay (docs/backfills.md)"
        )
    return f"{exc.message}; {who} needs ferry_relay: `grant ferry_relay to {grantee}` (docs/security.md, Privileges)"


#: PostgreSQL's words for a missing privilege on one object
_DENIED = re.compile(r"permission denied for (?P<kind>schema|table|view|sequence|function) (?P<name>.+)$")


def _is_ferrys(kind: str, name: str) -> bool:
    """Whether a refused object is pgferry's: its schema, or a table it creates (PostgreSQL names a
    table without its schema; the log's partitions are events_N)."""
    if kind == "schema":
        return name == "ferry"
    return kind != "table" or name in _ferry_tables() or re.fullmatch(r"events_\d+", name) is not None


@functools.cache
def _ferry_tables() -> frozenset[str]:
    return frozenset(
        m[1] for migration in sql.migrations() for m in re.finditer(r"create table ferry\.(\w+)", migration.sql)
    )


def _role_of(url: str | None) -> str | None:
    """The role of ``url``, written as a GRANT takes it (quoted unless a plain lower-case name)."""
    try:
        user = urlsplit(url).username if url else None
    except ValueError:
        return None
    if not user:
        return None
    role = unquote(user)
    return role if re.fullmatch(r"[a-z_][a-z0-9_$]*", role) else '"' + role.replace('"', '""') + '"'


#: PostgreSQL's refusals of an interval's text, and what one looks like (apply's max_age says the same)
INTERVAL_REFUSALS = errors.INTERVAL_REFUSALS
INTERVAL_HINT = errors.INTERVAL_HINT


@contextlib.contextmanager
def naming(option: str, refusals: tuple[str, ...], hint: str) -> Iterator[None]:
    """Name ``option`` (and add ``hint``) in a database refusal whose text holds one of ``refusals``:
    PostgreSQL's "invalid input syntax for type interval" of `--max-age banana` did not say which
    option it was about (outside review)."""
    try:
        yield
    except click.ClickException as exc:
        if not any(refusal in exc.message for refusal in refusals):
            raise
        raise click.ClickException(
            f"invalid value for {option}: {exc.message.removeprefix('pgferry: ')}; {hint}"
        ) from None


def require_url(database_url: str | None) -> str:
    if not database_url:
        raise click.UsageError(f"give --database-url or set {db.URL_ENV_VAR}")
    return database_url


def with_ferry(database_url: str | None, action: Callable[[pgferry.Ferry], Awaitable[T]]) -> T:
    """Run ``action`` with a Ferry on the given database, as one CLI command."""
    url = require_url(database_url)

    async def go() -> T:
        async with pgferry.connect(url, pool_size=2) as ferry:
            return await action(ferry)

    return run_coroutine(go(), url=url)  # type: ignore[no-any-return]


async def on_conn(f: pgferry.Ferry, action: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``action`` on one connection of the Ferry's pool."""
    async with f.pool.acquire() as conn:
        return await action(conn)


def print_json(rows: Any) -> None:
    click.echo(orjson.dumps(rows, default=str, option=orjson.OPT_INDENT_2).decode())


def escape(text: str) -> str:
    """``text`` with rich markup escaped, for f-strings printed with markup on."""
    return rich_escape(text)


def table(
    title: str,
    rows: list[dict[str, Any]],
    columns: list[tuple[str, str]],
    styles: dict[str, Callable[[Any], str]] | None = None,
) -> None:
    """A rich table in a terminal, cells coloured by ``styles``; plain aligned columns, one line
    a row however wide, in a pipe or a file (rich folded them into 80 columns: 1,000
    subscriptions became 4,921 lines, and took it 4 s to lay out)."""
    if not console.is_terminal:
        texts = [[cell(row.get(key)).plain for key, _ in columns] for row in rows]
        widths = [max([len(header)] + [len(t[i]) for t in texts]) for i, (_, header) in enumerate(columns)]
        click.echo(title)
        for line in [[header for _, header in columns], *texts]:
            click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
        return
    out = Table(title=title, title_justify="left")
    for _, header in columns:
        out.add_column(header, overflow="fold")
    styles = styles or {}
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            text = cell(value)
            if key in styles and value is not None:
                text.stylize(styles[key](value))
            cells.append(text)
        out.add_row(*cells)
    console.print(out)


def cell(value: Any) -> Text:
    """Plain text, never rich markup: cells hold what receivers answered (reason phrases,
    Location headers), and "[/bold]" there must neither crash the command nor style the
    output; control characters are shown escaped so none reaches the terminal."""
    if value is None:
        text = "-"
    elif isinstance(value, list | tuple):
        text = ",".join(map(str, value))
    elif isinstance(value, float):
        text = f"{value:.1f}"
    elif isinstance(value, datetime):
        text = f"{value:%Y-%m-%d %H:%M:%S}"
    else:
        text = str(value)
    return Text(visible(text))


def visible(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (``\\x1b``): keys,
    stream names and receivers' answers come from writers and receivers, and a raw ``ESC[2J`` in
    one cleared the operator's terminal (outside probe)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def attempts_table(rows: list[dict[str, Any]], title: str = "attempts") -> None:
    """Delivery attempts, as `pgferry trace` and `pgferry dlq show` print them."""
    for row in rows:
        row["outcome"] = "ok" if row["error_class"] is None else row["error_class"]
    columns = [("subscription", "subscription"), ("attempt", "#"), ("created_at", "at"), ("status", "status"),
               ("outcome", "outcome"), ("latency_ms", "ms"), ("error", "error"), ("response", "response")]  # fmt: skip
    table(title, rows, columns, styles={"outcome": lambda v: "green" if v == "ok" else "red"})


#: Cells of the bar in a backfill's progress cell (`pgferry status`, `pgferry backfill --list`).
PROGRESS_BAR_CELLS = 10


def progress_cell(done: int, total: int | None, finished: bool = False) -> str:
    """A backfill's share of its estimate as a percent and a small bar ("30% ███░░░░░░░"), both rounded
    down so that 100% and a full bar mean done; "" with no estimate. ``finished``: a backfill that is
    done shows 100% though its estimate was above the rows it found (a condition, rows deleted)."""
    if finished:
        share = 1.0
    elif not total:
        return ""
    else:
        share = min(done / total, 1.0)
    filled = int(share * PROGRESS_BAR_CELLS)
    return f"{int(share * 100)}% " + "█" * filled + "░" * (PROGRESS_BAR_CELLS - filled)


def backfill_rows(items: list[BackfillProgress]) -> list[dict[str, Any]]:
    """Backfills as `pgferry backfill --list` and `pgferry status` print them."""
    return [
        {
            "id": p.id,
            "table": p.table,
            "for": p.target or "everyone",
            "where": re.sub(r"\s*\n\s*", " ", p.condition or ""),  # deparsed over lines: one line, not "\n"
            "by": p.created_by or "",
            "state": (
                f"orphaned? no chunk for {p.idle_seconds or 0:,.0f} s: --resume {p.id}"
                if p.orphaned
                else p.state + (f": {p.reason}" if p.reason else "")
            ),
            "progress": progress_cell(p.rows_done, p.total, finished=p.state == "done"),
            "rows": rows_text(p.rows_done, p.total),
            "rate": f"{p.rate:,.0f}/s" if p.rate is not None else "",
            "eta": str(p.eta).split(".")[0] if p.eta is not None else "",
        }
        for p in items
    ]


BACKFILL_COLUMNS = [("id", "id"), ("table", "table"), ("for", "for"), ("where", "where"), ("by", "by"),
                    ("state", "state"), ("progress", "progress"), ("rows", "rows done"), ("rate", "rate"),
                    ("eta", "ETA")]  # fmt: skip


_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


class ByteSize(click.ParamType[int]):
    """A positive number of bytes, e.g. 16777216, 16MB or 512KB (units are powers of 1024)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            number, unit = value, ""
        else:
            text = str(value).strip().upper().replace(" ", "")
            digits = text.rstrip("BKMGI")
            number_text, unit = digits, text[len(digits) :]
            if not number_text.isdigit() or unit not in _SIZE_UNITS:
                self.fail(
                    f"{value!r} is not a size: give a whole number of bytes, or one with KB, MB or GB", param, ctx
                )
            number = int(number_text)
        size = number * _SIZE_UNITS[unit]
        if size <= 0:
            self.fail(f"{value!r} must be positive", param, ctx)
        return size
