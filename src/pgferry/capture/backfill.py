"""Backfills: the rows a captured table already holds, as READ events in the same log.

The work is SQL (``ferry.backfill`` records one, ``ferry.backfill_chunk`` does one chunk in
its own short transaction; migration 0013 proves why a chunk is ordered right against live
writes). This module starts backfills, drives them chunk after chunk (``BackfillRunner``,
a ``run(stop)`` service) and reads their progress (rows done, estimate, rate, ETA) for the
CLI, ``pgferry status``, the dashboard and metrics.

Who runs a backfill: the process that asks for it (``pgferry backfill``), not the relay.
A chunk reads the table and evaluates the condition with the rights of the role that runs
it; the relay's role can read the subscriptions' secrets and needs no right on the
application's tables, so having it run SQL written by whoever may call ``ferry.backfill``
would hand that SQL the relay's rights. Progress is stored with every chunk, so a runner
killed at any moment is replaced by ``pgferry backfill --resume ID`` (any host, any time),
which goes on after the last chunk that committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from pgferry import db, sql
from pgferry.aio import wait_for_event
from pgferry.errors import InvalidBackfill, one_line

log = logging.getLogger(__name__)

#: Rows per chunk transaction (ferry.backfill's default). A writer of a row in the chunk being read
#: waits for the chunk to commit, so what random single-row writers lose grows with the square of
#: the chunk (chunk/rows of them wait, chunk/rate/2 on average). With 10,000, 4 pgbench writers on
#: a 1,000,000-row table kept 41% of their throughput (busy shared machine); 2,000 makes the wait
#: 25 times smaller, and rows/s into the log stayed within noise (137K vs 143K rows/s, 300,000
#: rows); 1,000 began to pay per-chunk overhead.
DEFAULT_CHUNK = 2_000
#: Seconds without a chunk after which a running backfill is shown as orphaned (a chunk of
#: DEFAULT_CHUNK rows takes well under a second; a runner paced by --max-rate 1 row/s, 2,000 s).
ORPHANED_AFTER = 120.0


@dataclass(frozen=True)
class Progress:
    """Where one backfill is: what ``pgferry status``, the dashboard and metrics show."""

    id: int
    table: str
    target: str | None
    condition: str | None
    chunk_size: int
    rows_done: int
    rows_estimate: int | None
    state: str
    reason: str | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: the role that recorded it (the one that runs a backfill with a condition)
    created_by: str | None = None
    #: seconds since its last chunk (None: not known)
    idle_seconds: float | None = None

    @property
    def orphaned(self) -> bool:
        """Running, but no chunk for ORPHANED_AFTER seconds: its runner is gone (``--resume`` it)."""
        return self.state == "running" and self.idle_seconds is not None and self.idle_seconds > ORPHANED_AFTER

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Progress:
        return cls(
            id=row["id"],
            table=row["table_name"],
            target=row["target"],
            condition=row["condition"],
            chunk_size=row["chunk_size"],
            rows_done=row["rows_done"],
            rows_estimate=row["rows_estimate"],
            state=row["state"],
            reason=row["reason"],
            started_at=row["started_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            created_by=row["created_by"],
            idle_seconds=row["idle_seconds"],
        )

    @property
    def total(self) -> int | None:
        """The estimate of the rows to do (the planner's, at the start); the rows found once done.
        None when there is none, or when the rows done passed it before the end: on a table never
        analyzed the planner guessed about half, and progress read 100%, ETA 0:00:00, with a third
        of the rows to go, and a backfill cancelled at 75% read 100% (outside probe).

        With a condition it is the whole table's: an upper bound."""
        if self.state == "done":
            return self.rows_done
        if self.rows_estimate is None or self.rows_done > self.rows_estimate:
            return None
        return self.rows_estimate

    @property
    def rate(self) -> float | None:
        """Rows per second since it started (pauses and a dead runner's gap count: a fair average),
        up to now while it runs: a runner killed mid-way showed its last rate and ETA unchanged until
        it counted as orphaned (outside probe); now its rate falls and its ETA grows meanwhile."""
        seconds = ((self.finished_at or self.updated_at) - self.started_at).total_seconds()
        if self.state == "running" and self.idle_seconds is not None:
            seconds += max(0.0, self.idle_seconds)
        return self.rows_done / seconds if seconds > 0 and self.rows_done > 0 else None

    @property
    def eta(self) -> timedelta | None:
        """Time left at the average rate, for a running backfill with an estimate."""
        if self.state != "running" or self.orphaned or self.rate is None or self.total is None:
            return None
        return timedelta(seconds=max(0, self.total - self.rows_done) / self.rate)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "table": self.table,
            "target": self.target,
            "condition": self.condition,
            "chunk_size": self.chunk_size,
            "state": self.state,
            "orphaned": self.orphaned,
            "reason": self.reason,
            "created_by": self.created_by,
            "rows_done": self.rows_done,
            "rows_estimate": self.total,
            "rows_per_second": round(self.rate, 1) if self.rate is not None else None,
            "eta_seconds": round(self.eta.total_seconds(), 1) if self.eta is not None else None,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "finished_at": self.finished_at,
        }


#: SQLSTATEs ferry.backfill_chunk raises and leaves the backfill running for: serialization failure,
#: deadlock, query canceled (a cancel, statement_timeout), lock_timeout, out of resources
TRANSIENT = {"40001", "40P01", "57014", "55P03", "53000", "53100", "53200", "53300"}


#: What the cast of a table's name to regclass raises for a name that names no table: unknown
#: table or schema, and a name that is no name (`"Order Items` unterminated, `a.b.c.d`, `a.b.c`).
NO_SUCH_TABLE = {"42P01", "3F000"}
NOT_A_NAME = {"42602", "42601", "0A000"}


def _refused(exc: asyncpg.PostgresError, table: str | None = None) -> InvalidBackfill | None:
    """The SQL functions' own refusals (a ``pgferry:`` message, whatever its SQLSTATE: an invalid
    condition keeps the parser's), and a ``table`` name that names no table."""
    sqlstate = getattr(exc, "sqlstate", None)
    if str(exc).startswith("pgferry:") or sqlstate in NO_SUCH_TABLE:
        return InvalidBackfill(one_line(exc).removeprefix("pgferry: "))
    if table is not None and sqlstate in NOT_A_NAME:
        return InvalidBackfill(
            f"{table!r} is not a table name ({one_line(exc)}): write schema.table, with double quotes around a "
            "part that has spaces, capitals or dots, e.g. 'public.\"Order Items\"'"
        )
    return None


async def start(
    conn: asyncpg.Connection,
    table: str,
    *,
    subscription: str | None = None,
    consumer: str | None = None,
    condition: str | None = None,
    chunk_size: int | None = None,
) -> int:
    """Record a backfill (state running) and return its id; refused input raises InvalidBackfill."""
    try:
        return int(
            await conn.fetchval(
                sql.query("backfill_create"),
                table,
                subscription,
                consumer,
                condition,
                DEFAULT_CHUNK if chunk_size is None else chunk_size,
            )
        )
    except asyncpg.PostgresError as exc:
        if (refused := _refused(exc, table)) is not None:
            raise refused from None
        raise


#: How long a pause, resume or cancel waits for a chunk in progress before it says that it waits.
SET_STATE_WAIT = "5s"


async def set_state(
    conn: asyncpg.Connection,
    backfill: int,
    action: str,
    *,
    on_wait: Callable[[], None] | None = None,
    chunk_size: int | None = None,
) -> str:
    """``cancel``, ``pause`` or ``resume`` a backfill (a resume with ``chunk_size``: its chunks
    from now on); returns its state afterwards. A chunk in progress holds its backfill until it
    commits: one stuck on a lock made ``--cancel`` from another shell hang without a word (outside
    probe). With ``on_wait``, it is called once the wait passed SET_STATE_WAIT (to say so), and
    the wait goes on."""
    query = sql.query("backfill_set_state")
    try:
        if on_wait is not None:
            try:
                async with conn.transaction():
                    await conn.execute(f"set local lock_timeout = '{SET_STATE_WAIT}'")
                    return str(await conn.fetchval(query, backfill, action, chunk_size))
            except asyncpg.LockNotAvailableError:
                on_wait()
        return str(await conn.fetchval(query, backfill, action, chunk_size))
    except asyncpg.PostgresError as exc:
        if (refused := _refused(exc)) is not None:
            raise refused from None
        raise


async def progress(conn: asyncpg.Connection, backfill: int) -> Progress:
    row = await conn.fetchrow(sql.query("backfill_progress"), backfill, None)
    if row is None:
        raise InvalidBackfill(f"backfill {backfill} does not exist (see `pgferry backfill --list`)")
    return Progress.from_row(row)


async def listing(conn: asyncpg.Connection, finished_within: timedelta = timedelta(days=1)) -> list[Progress]:
    """Backfills running or paused, and those finished within ``finished_within``."""
    return [Progress.from_row(r) for r in await conn.fetch(sql.query("backfill_progress"), None, finished_within)]


@dataclass
class BackfillSettings:
    """How a runner drives one backfill."""

    backfill: int
    #: pause before trying again when another runner holds the backfill (it is doing a chunk)
    busy_wait: float = 0.2
    #: times in a row a chunk may fail for a transient reason (deadlock, cancel, lock or statement
    #: timeout) and be tried again, after busy_wait x 2, 4, 8 ... seconds
    transient_tries: int = 6
    #: rows per second at most, on average since this runner began (None: as fast as it goes): leaves
    #: the table's writers more of a small machine's CPU and disk
    max_rate: float | None = None

    def __post_init__(self) -> None:
        if self.backfill < 1:
            raise ValueError(f"backfill must be a backfill id (>= 1), not {self.backfill}")
        if self.busy_wait <= 0:
            raise ValueError(f"busy_wait must be > 0 seconds, not {self.busy_wait}")
        if self.max_rate is not None and self.max_rate <= 0:
            raise ValueError(f"max_rate must be > 0 rows per second, not {self.max_rate}")


class BackfillRunner:
    """Drives one backfill chunk by chunk until it is no longer running or ``stop`` is set.

    Each chunk is one call of ``ferry.backfill_chunk`` in its own transaction on ``conn``.
    Stopping between chunks loses nothing: the backfill stays running and any runner goes on.
    """

    def __init__(
        self,
        conn: asyncpg.Connection,
        settings: BackfillSettings,
        observe: Callable[[int, int | None, int], None] | None = None,
    ) -> None:
        self.conn = conn
        self.settings = settings
        #: after every chunk: (rows done so far, estimate of the total, rows of this chunk)
        self.observe = observe

    async def run(self, stop: asyncio.Event) -> str:
        """Returns the backfill's state when it stopped running, or 'running' if ``stop`` came first."""
        s = self.settings
        began, rows, failures = time.monotonic(), 0, 0
        while not stop.is_set():
            try:
                row = await self.conn.fetchrow(sql.query("backfill_chunk"), s.backfill)
            except asyncpg.PostgresError as exc:
                if (refused := _refused(exc)) is not None:
                    raise refused from None
                if getattr(exc, "sqlstate", None) not in TRANSIENT or failures >= s.transient_tries:
                    smaller = (  # a statement_timeout that cancels every chunk: fewer rows a chunk
                        f" (or with smaller chunks: --resume {s.backfill} --chunk N)" if exc.sqlstate == "57014" else ""
                    )
                    raise InvalidBackfill(
                        f"backfill {s.backfill}: its chunk failed ({one_line(exc)}); the backfill is still "
                        f"running from its last chunk: go on with `pgferry backfill --resume {s.backfill}`{smaller}"
                    ) from None
                failures += 1  # a deadlock, a cancel, a lock or statement timeout: the chunk again, later
                log.warning("backfill %d: chunk failed (%s); trying again in %.1f s",
                            s.backfill, one_line(exc), s.busy_wait * 2**failures)  # fmt: skip
                await wait_for_event(stop, s.busy_wait * 2**failures)
                continue
            except db.CONNECTION_ERRORS as exc:
                raise InvalidBackfill(
                    f"backfill {s.backfill}: lost the connection to PostgreSQL ({db.describe(exc)}); the backfill "
                    f"is still running from its last chunk: go on with `pgferry backfill --resume {s.backfill}`"
                ) from None
            failures = 0
            if row is None:  # pragma: no cover - the function always returns one row
                raise InvalidBackfill(f"backfill {s.backfill}: ferry.backfill_chunk returned nothing")
            state = str(row["state"])
            if state == "busy":
                await wait_for_event(stop, s.busy_wait)
                continue
            if self.observe is not None:
                self.observe(int(row["rows_done"]), row["rows_estimate"], int(row["chunk_rows"]))
            if state != "running":
                return state
            rows += int(row["chunk_rows"])
            ahead = rows / s.max_rate - (time.monotonic() - began) if s.max_rate is not None else 0.0
            if ahead > 0:
                await wait_for_event(stop, ahead)
        return "running"
