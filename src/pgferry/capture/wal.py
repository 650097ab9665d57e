"""WAL capture: decode the logical replication slot into ``ferry.events``, exactly once.

Runs on the relay holding the WAL capture lock (relay/leader.py): the lock's connection
appends, a replication connection (capture/replication.py, psycopg2 in a thread) streams
the slot's changes in ``pgoutput`` form, and capture/pgoutput.py decodes them.

Exactly once into the log:

* changes are appended in rounds, each one transaction on the lock's connection that
  ends at a source transaction's commit; ``ferry._append_wal_v2`` moves
  ``ferry.wal_slot.lsn`` to the end of that commit in the same transaction;
* only after the round commits is the position confirmed to the server (the slot's
  ``confirmed_flush_lsn``), so PostgreSQL never forgets a change the log does not hold;
* a relay that dies between the two streams those transactions again, and skips every
  transaction committed before ``ferry.wal_slot.lsn``: no loss, no duplicate.

A source transaction of any size is one round (appended in chunks of ``chunk`` changes or
``chunk_bytes`` bytes, committed once), so the log gets all of it or none. Rounds commit as soon as the stream
has nothing more right now, or every ``chunk`` changes: low latency while it trickles,
large transactions while it pours. While the captured tables are idle, the server's
keepalives say how far it has read, and the relay confirms up to there: an idle capture
never holds WAL back.

In commit order with everything else in the log (migration 0028): each change is stored
under its source transaction's id (``Begin.xid``), so it is in the batch of that
transaction's commit; the ticker waits for the slot's confirmed position before it records
a tick that sees the transaction (ferry._tick_fenced), which is why a confirmation is sent
the moment it is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.capture.pgoutput import UNCHANGED, Begin, Change, Commit, Relation, Truncate, decode
from pgferry.capture.replication import Batch, ReplicationError, ReplicationStream
from pgferry.errors import one_line

log = logging.getLogger(__name__)

#: What ferry._ensure_wal_slot notifies when it creates the slot (a first WAL capture, a reset).
WAL_CHANNEL = "pgferry_wal"

#: The types written into the row object as to_jsonb writes them (ferry._append_wal_v2's fast path
#: lists the same types, with the text ones, as those it may store without converting).
#: json and jsonb: their text is JSON already, and goes into the row object as JSON.
JSON_TYPES = frozenset({114, 3802})
#: int2, int4, int8, float4, float8, numeric: to_jsonb writes them as JSON numbers, as their text
NUMBER_TYPES = frozenset({21, 23, 20, 700, 701, 1700})
NOT_JSON_NUMBERS = frozenset({"NaN", "Infinity", "-Infinity"})
BOOL = 16
#: OIDs from here on are the database's own types (domains among them), not built-in ones
FIRST_USER_OID = 16384
#: SQLSTATEs of a decoded value the column's type no longer takes: invalid input (an enum value
#: renamed, a composite type altered), a check or not-null violation (a domain's constraint).
NO_LONGER_ACCEPTED = frozenset({"22P02", "23514", "23502"})
#: SQLSTATEs of a name not found (function, table, type or schema): what a function that relies on
#: search_path raises in the relay's session (search_path pg_catalog)
NOT_FOUND = frozenset({"42883", "42P01", "42704", "3F000"})
#: SQLSTATE classes of failures another attempt may not meet: serialization, resources,
#: an operator's intervention (a connection's end is db.CONNECTION_ERRORS). The relay's leader
#: job handles them as any other: it steps down and comes back.
_TRANSIENT = frozenset({"40", "53", "57", "58"})


@dataclass
class WalSettings:
    #: changes appended per statement, and the most a round holds before it commits at the next
    #: transaction boundary
    chunk: int = 5_000
    #: ... and bytes of decoded rows per statement at most (at least one change): a round of
    #: 4,800 rows of 120 KB, old and new, was one 1.15 GB statement, over PostgreSQL's 1 GB
    #: message limit and the relay's command timeout, retried forever (outside probe)
    chunk_bytes: int = 16 << 20
    #: an append statement's deadline grows with what it carries: the connection's command_timeout
    #: plus this many seconds per MB of decoded rows. One change is never split, and one 92 MB row
    #: (184 MB as hex) took longer than the default 10 s: the statement was cut off, taken for a
    #: lost connection, and tried again forever, holding all WAL capture (outside probe).
    append_seconds_per_mb: float = 1.0
    #: how often every WAL capture's problems (ferry._wal_identity_problems: a table out of the
    #: publication, a replica identity changed) are looked at, to log new ones
    problems_interval: float = 30.0
    #: how often a missing or invalidated slot is looked at again (a new slot is notified)
    recheck_interval: float = 5.0
    #: backoff cap when the stream cannot be started (the slot read by a relay that is going away)
    max_backoff: float = 5.0
    #: the longest the leadership connection stays silent while nothing is captured: PostgreSQL
    #: ends a lock-holding session idle for Liveness.session_timeout (30 s), and another relay
    #: took the lead while this one still streamed the slot (found by an outside probe)
    keepalive_interval: float = 10.0


#: no new batch this time round (a round's commit ended)
_NO_BATCH = Batch([], 0)


class AppendTimedOut(Exception):
    """An append statement did not finish within its deadline (WalSettings.append_seconds_per_mb)."""

    def __init__(self, size: int, timeout: float, relids: list[int]) -> None:
        super().__init__(f"{size} bytes, {timeout:.0f} s")
        self.size = size
        self.timeout = timeout
        self.relids = relids


@dataclass
class _Pending:
    """Changes decoded and not yet appended, as the arrays ferry._append_wal_v2 takes."""

    relids: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    rows: list[bytes] = field(default_factory=list)
    olds: list[bytes | None] = field(default_factory=list)
    missing: list[bytes | None] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    lsns: list[int] = field(default_factory=list)
    #: each change's source transaction, as the WAL numbers it (32 bits)
    xids: list[int] = field(default_factory=list)
    #: the changes at a position the operator chose to skip (ferry.skip_wal_change): their index, and
    #: their column => text values (the key of the row to backfill)
    skips: list[tuple[int, bytes]] = field(default_factory=list)
    #: bytes of rows, old rows and missing lists held
    size: int = 0


class WalCapture:
    """Streams the slot into the log until ``stop`` is set or the connection fails."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        url: str,
        settings: WalSettings | None = None,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        self.conn = conn
        self.url = url
        self.settings = settings or WalSettings()
        self.relations: dict[int, Relation] = {}
        #: events appended since start
        self.events = 0
        #: the position the log is complete up to, as this process last wrote or read it
        self.lsn = 0
        #: metrics hook: events appended by a round
        self.observe = observe
        self._reported_lost: str | None = None
        self._tx: asyncpg.transaction.Transaction | None = None  # the open round's
        self._round = 0  # events appended in the open round
        self._round_xids: set[int] = set()  # the source transactions of the open round
        #: why the last append failed (None: it did not), and the tables its changes were of
        self._failing: str | None = None
        self._failed = _Pending()
        #: user-defined types met in relations: whether each is a domain over json or jsonb
        self._json_domains: dict[int, bool] = {}
        #: REPLICA IDENTITY problems logged (ferry._wal_identity_problems), so each is said once
        self._identity_logged: set[str] = set()
        #: positions of changes the operator chose to skip (ferry.wal_slot.skip_lsns), as read at the stream's start
        self._skip: frozenset[int] = frozenset()

    async def run(self, stop: asyncio.Event) -> None:
        # The append must be durable before the slot moves past it: never synchronous_commit off here.
        await self.conn.execute("set synchronous_commit = on")
        # A new slot is notified (the first WAL capture, a reset): the stream starts at once rather
        # than at the next look. Stopping wakes the wait as well.
        wake = asyncio.Event()
        await self.conn.add_listener(WAL_CHANNEL, lambda *_: wake.set())
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: wake.set())
        failures = 0
        try:
            while not stop.is_set():
                wake.clear()
                slot = await self.conn.fetchrow(sql.query("wal_slot"))
                if slot is None:  # nothing is captured from the WAL
                    await wait_for_event(wake, self.settings.recheck_interval)
                    continue
                if slot["problem"] is not None:
                    await self._report_lost(slot)
                    await wait_for_event(wake, self.settings.recheck_interval)
                    continue
                # An error recorded by an earlier leader (or process) is this one's to clear once
                # appending works: it stayed in status for good beside "behind by 0 bytes" (outside probe).
                self._failing = self._failing or slot["error"]
                failures = await self._stream(slot, stop, failures)
        finally:
            stopping.cancel()

    async def _stream(self, slot: asyncpg.Record, stop: asyncio.Event, failures: int) -> int:
        """Follow the slot until ``stop`` or the stream breaks; returns the failures in a row."""
        self._reported_lost = None
        self.lsn = _lsn(slot["lsn"])
        # Read at each start, so a skip asked while an append fails is taken at the next try (every
        # few seconds), without a restart.
        self._skip = frozenset(_lsn(at) for at in slot["skip_lsns"])
        stream = ReplicationStream(self.url, slot["slot_name"], slot["publication"], self.lsn)
        try:
            await self._follow(stream, stop)
            return 0
        except ReplicationError as exc:
            failures += 1
            delay = backoff_delay(failures, base=0.2, cap=self.settings.max_backoff)
            log.warning("WAL capture: %s; again in %.1f s", exc, delay)
            await wait_for_event(stop, delay)
            return failures
        except AppendTimedOut as exc:
            # Not a lost connection (asyncpg cancelled the statement; the connection is usable): a
            # statement too large for its deadline, which another try meets again. Say so where
            # status shows it, with what to do, and try again.
            failures += 1
            tables = ", ".join(sorted({self._table_name(oid) for oid in exc.relids})) or "?"
            await self._record_failing(
                f"cannot append the changes of {tables} at {_lsn_text(self.lsn)}: one statement of "
                f"{exc.size / (1 << 20):.1f} MB of decoded rows did not finish within its {exc.timeout:.1f} s "
                f"(the relay's --db-command-timeout plus {self.settings.append_seconds_per_mb:g} s per MB; a single "
                "change is never split). Restart the relays with a larger --db-command-timeout (and "
                "--db-session-timeout above it), or see what slows the database; WAL capture retries and holds "
                "every later change until then"
            )  # fmt: skip
            await wait_for_event(stop, backoff_delay(failures, base=0.5, cap=self.settings.max_backoff))
            return failures
        except asyncpg.PostgresError as exc:
            if isinstance(exc, db.CONNECTION_ERRORS) or exc.sqlstate[:2] in _TRANSIENT:
                raise
            # The change cannot be appended as the capture stands: hold here (nothing after it
            # may enter the log first), say why where status shows it, and try again.
            failures += 1
            await self._report_failing(exc)
            await wait_for_event(stop, backoff_delay(failures, base=0.5, cap=self.settings.max_backoff))
            return failures
        finally:
            await stream.close()

    async def _report_failing(self, exc: asyncpg.PostgresError) -> None:
        # ferry._append_wal_v2 runs one statement per capture, "/* pgferry capture <id> */ ... where
        # x.relid = <oid>": the one that failed is in the error's context, or (an error parsing it:
        # a column dropped since) in its internal query; else every table of the failed append.
        context = f"{getattr(exc, 'context', None) or ''} {getattr(exc, 'internal_query', None) or ''}"
        failed = re.search(r"x\.relid = (\d+)", context)
        capture = re.search(r"pgferry capture (\d+)", context)
        relids = [int(failed.group(1))] if failed else self._failed.relids
        fixes: list[str] = []
        if failed is None and capture is None and exc.sqlstate[:2] == "22":
            # Failed before any statement of the append ran: a row the log cannot hold as jsonb (a json
            # value such as {"a": 1e1000000}, or one holding \u0000), refused as the rows were read in.
            # The message named every table of the append and offered nothing that worked (outside probe).
            found = await self._unholdable_change(self._failed)
            if found is not None:
                relids = [self._failed.relids[found]]
                at = _lsn_text(self._failed.lsns[found])
                table = self._table_name(self._failed.relids[found])
                fixes.append(
                    f"A change of it (at {at}) holds a value the log cannot hold (a trigger would have refused the "
                    f"write; from the WAL it is committed), and no correction reaches it. Skip that one change: "
                    f"select ferry.skip_wal_change('{at}'); (WAL capture leaves it out at its next try and records it "
                    f"as a gap of each consumer reading {table}, ferry.gaps), then pgferry backfill {table} --where "
                    "'<its key>' (the gap's reason names it) to send that row's current state. The broader way out: "
                    "stop every relay (ferry.reset_wal_slot() refuses while one reads the slot), run select "
                    "ferry.reset_wal_slot(); which records the changes not yet appended, of every table captured "
                    "from the WAL, as a gap of their readers, start the relays, and pgferry backfill each table "
                    "captured from the WAL"
                )  # fmt: skip
        tables = ", ".join(sorted({self._table_name(oid) for oid in relids})) or "?"
        if exc.sqlstate in NOT_FOUND and failed is not None:
            fixes.extend(await self._generated_column_fixes(int(failed.group(1))))
        if exc.sqlstate in NO_LONGER_ACCEPTED:  # the hint named only the condition (outside probe)
            fixes.append("If a type changed after the change was made (an enum value renamed, a composite type "
                         "altered, a domain constraint added NOT VALID), its value no longer reads back: undo that "
                         "type change until capture has passed this position, then make it again")  # fmt: skip
        # Only a condition can be corrected in the capture (an update of ferry.captures): offered for
        # a capture without one, the fix did not apply (outside probe).
        if capture is not None and await self.conn.fetchval(sql.query("wal_capture_has_condition"),
                                                            int(capture.group(1))):  # fmt: skip
            fixes.append(f"The change was made under capture {capture.group(1)}, whose condition still applies to "
                         "it (capturing the table again changes what comes after): if the condition raised, correct "
                         f"it: update ferry.captures set condition = '...' where id = {capture.group(1)}")  # fmt: skip
        fix = ". ".join(fixes or ["Fix what the error names"])
        error = (f"cannot append the changes of {tables} at {_lsn_text(self.lsn)}: {one_line(exc).rstrip('.')}. "
                 f"{fix}; WAL capture retries and holds every later change until then")  # fmt: skip
        await self._record_failing(error)

    async def _generated_column_fixes(self, relid: int) -> list[str]:
        """What to do when the table's stored generated columns call functions of the user's own
        that do not set their search_path: the relay computes them again in a session that searches
        pg_catalog only (its search_path is not widened: writers could plant functions in public),
        so a name such a function leaves unqualified is not found (outside probe)."""
        fixes = []
        for row in await self.conn.fetch(sql.query("wal_generated_functions"), relid):
            first = row["functions"][0]
            schema = first.split(".", 1)[0]
            fixes.append(
                f"The relay computes the stored generated column {row['col']} ({row['expr']}) again (the WAL has "
                f"no value for it before PostgreSQL 18), in a session whose search_path is pg_catalog only: a "
                f"function it calls ({', '.join(row['functions'])}) may name something of another schema unqualified. "
                f"Schema-qualify the names inside it, or alter function {first} set search_path = {schema} "
                "(the schemas its body needs)"
            )  # fmt: skip
        return fixes

    async def _unholdable_change(self, pending: _Pending) -> int | None:
        """The first change of ``pending`` whose row or old row jsonb refuses, found by halves (a
        dozen statements for a chunk of 5,000), or None."""
        texts = [[row.decode()] + ([old.decode()] if old is not None else []) for row, old in
                 zip(pending.rows, pending.olds, strict=True)]  # fmt: skip

        async def holds(lo: int, hi: int) -> bool:
            try:
                await self.conn.fetchval(sql.query("wal_rows_as_jsonb"), [t for ts in texts[lo:hi] for t in ts])
            except asyncpg.DataError:
                return False
            return True

        lo, hi = 0, len(texts)
        if hi == 0 or await holds(lo, hi):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await holds(lo, mid):
                lo = mid
            else:
                hi = mid
        return lo

    async def _record_failing(self, error: str) -> None:
        """Record why appending fails (ferry.wal_slot.error: status, the dashboard, metrics) and log it once."""
        await self.conn.execute(sql.query("wal_failing"), error)
        if error != self._failing:
            log.error("WAL capture: %s", error)
        self._failing = error

    async def _describe(self, rel: Relation) -> None:
        """Keep ``rel``, knowing which of its columns are JSON: of type json or jsonb, or of a
        domain over them (their values were written as JSON strings: '{"a": 1}' for {"a": 1})."""
        domains = {c.type_oid for c in rel.columns if c.type_oid >= FIRST_USER_OID} - self._json_domains.keys()
        if domains:
            found = set(await self.conn.fetchval(sql.query("wal_json_domains"), list(domains)))
            self._json_domains.update((oid, oid in found) for oid in domains)
        json_types = JSON_TYPES | {oid for oid, is_json in self._json_domains.items() if is_json}
        _shape(rel, json_types)
        self.relations[rel.oid] = rel
        # The WAL describes a table again after an ALTER TABLE, REPLICA IDENTITY among them: say
        # at once if the table's identity no longer gives what its capture needs (DELETEs would
        # come without a key). capture_table refuses such a table; an ALTER later cannot be.
        self._log_problems(await self.conn.fetch(sql.query("wal_identity_problems"), rel.oid))

    def _log_problems(self, rows: list[asyncpg.Record], every: bool = False) -> None:
        """Log each problem of ferry._wal_identity_problems once; with ``every`` (rows are all of
        them now), forget those gone, so that one coming back is said again."""
        said = {f"{row['tbl']}: {row['problem']}" for row in rows}
        for line in sorted(said - self._identity_logged):
            log.error("WAL capture of %s", line)
        self._identity_logged = said if every else self._identity_logged | said

    async def _check_problems(self) -> None:
        """Every WAL capture's problems (ferry._wal_identity_problems), looked at now and then: a
        table taken out of the publication by hand is never described by the WAL again, and its
        changes were lost without a word in the log (outside probe)."""
        self._log_problems(await self.conn.fetch(sql.query("wal_identity_problems"), None), every=True)

    def _table_name(self, oid: int) -> str:
        rel = self.relations.get(oid)
        return f"{rel.schema}.{rel.name}" if rel is not None else f"relation {oid}"

    async def _follow(self, stream: ReplicationStream, stop: asyncio.Event) -> None:
        """Append what the stream brings, a round at a time, until ``stop``.

        The database's work overlaps Python's: each append (or a round's final append and
        commit) runs as a task on the connection while the next batches are decoded, and a
        round starts only when the one before has committed, with every transaction that
        came meanwhile: appends run one at a time and in order, and commits group themselves
        under load.
        """
        chunk, chunk_bytes = self.settings.chunk, self.settings.chunk_bytes
        skip_before = self.lsn  # transactions committed before it are in the log already
        pending = _Pending()
        in_round = 0  # changes of the open round handed to appends already (pending holds the rest)
        dirty = False  # the open round has something to commit (changes, or a position to move)
        skip = open_xact = False
        commit_time: datetime | None = None
        xid = 0  # the open source transaction's
        last_end = self.lsn
        confirmed = self.lsn
        idle_end = self.lsn  # the furthest wal_end a keepalive reported
        self._tx = None
        self._round = 0
        self._round_xids = set()
        tail: asyncio.Task[None] | None = None
        stopper = asyncio.ensure_future(stop.wait())
        batches = aiter(stream.batches())
        getter: asyncio.Future[Batch] | None = None
        keepalive = self.settings.keepalive_interval
        loop_time = asyncio.get_running_loop().time
        spoke_at = loop_time()
        checked_at = -self.settings.problems_interval  # at once, then every problems_interval
        try:
            while not stop.is_set():
                if getter is None:
                    getter = asyncio.ensure_future(anext(batches))
                waiters: set[asyncio.Future[Any]] = {getter, stopper}
                if tail is not None:
                    waiters.add(tail)
                    spoke_at = loop_time()  # an append is under way on the connection
                elif loop_time() - checked_at >= self.settings.problems_interval and self._tx is None:
                    await self._check_problems()  # between rounds: also keeps the leadership session alive
                    spoke_at = checked_at = loop_time()
                elif loop_time() - spoke_at >= keepalive:  # idle: keep the leadership session alive
                    await self.conn.execute(sql.query("keepalive"))
                    spoke_at = loop_time()
                done, _ = await asyncio.wait(waiters, timeout=keepalive, return_when=asyncio.FIRST_COMPLETED)
                if tail is not None and tail.done():
                    # Its end now, not when the next batch comes: a failed append (the database
                    # stopping) holds its confirmation back, and a server shutting down sends
                    # nothing more until it has it (a fast shutdown waited out pg_ctl's 60 s).
                    finished, tail = tail, None
                    finished.result()
                if getter in done:
                    batch, getter = getter.result(), None
                    if not batch.messages:  # a keepalive: everything committed before wal_end was sent
                        idle_end = max(idle_end, batch.wal_end)
                elif stopper in done:
                    break
                else:
                    batch = _NO_BATCH
                for data, start in zip(batch.messages, batch.starts, strict=True):
                    m = decode(data)
                    if isinstance(m, Change):
                        if not skip:
                            self._add(pending, m, commit_time, start, xid)
                    elif isinstance(m, Begin):
                        open_xact = True
                        skip = m.final_lsn < skip_before
                        xid = m.xid
                        commit_time = datetime.fromtimestamp(m.commit_time_us / 1e6, UTC)
                    elif isinstance(m, Commit):
                        open_xact = False
                        if not skip:
                            last_end, dirty = m.end_lsn, True
                            if in_round + len(pending.ops) >= chunk:
                                # A backlog: the stream never runs dry nor ends a batch at a commit
                                # while an append runs, and the whole catch-up was one round (8.8
                                # million rows, 2.5 minutes: nothing visible, the slot not confirmed
                                # and lost under max_slot_wal_keep_size; outside probe). The round
                                # ends at this transaction's end.
                                if tail is not None:
                                    await tail
                                tail = asyncio.create_task(self._write(pending, max(last_end, self.lsn), commit_time,
                                                                       stream))  # fmt: skip
                                pending, dirty, in_round = _Pending(), False, 0
                                confirmed = max(confirmed, last_end)
                    elif isinstance(m, Relation):
                        if tail is not None:  # the connection is the append's
                            await tail
                            tail = None
                        await self._describe(m)
                    elif isinstance(m, Truncate) and not skip:
                        for rel in m.relations:
                            _append(pending, rel, "T", b"{}", None, None, commit_time, start, xid)
                    if len(pending.ops) >= chunk or pending.size >= chunk_bytes:  # a large round: append what
                        # there is, commit at its end
                        if tail is not None:
                            await tail
                        tail = asyncio.create_task(self._write(pending, None, None, stream))
                        in_round += len(pending.ops)
                        pending, dirty = _Pending(), True
                if open_xact or tail is not None:
                    # Mid-transaction; or a round is committing: what comes meanwhile waits for the
                    # next round, started when it ends (one commit for all of it: at 1,000
                    # transactions/s a round a batch was a commit every 2 ms, and each transaction
                    # waited behind the commits before it, 10 ms from its commit to the log).
                    continue
                # At a transaction boundary with the stream drained for now and no round committing:
                # commit the round, then confirm it to the server.
                if dirty or pending.ops:
                    tail = asyncio.create_task(self._write(pending, max(last_end, self.lsn), commit_time, stream))
                    pending, dirty, in_round = _Pending(), False, 0
                    confirmed = max(confirmed, last_end)
                elif idle_end > confirmed:
                    # Idle: nothing of ours before the server's read position. The slot may move
                    # there; ferry.wal_slot.lsn need not (writing it would make WAL to read).
                    confirmed = idle_end
                    self.confirm(stream, confirmed)
            if tail is not None:
                await tail
                tail = None
        finally:
            stopper.cancel()
            if getter is not None:
                getter.cancel()
            if tail is not None:
                tail.cancel()
                with contextlib.suppress(BaseException):
                    await tail
            if self._tx is not None:
                with contextlib.suppress(*db.CONNECTION_ERRORS, asyncpg.PostgresError):
                    await self._tx.rollback()
                self._tx = None

    async def _write(self, pending: _Pending, to: int | None, committed_at: datetime | None,
                     stream: ReplicationStream) -> None:  # fmt: skip
        """Append ``pending`` in the open round; with ``to``, also end the round there: commit,
        then confirm ``to`` to the server."""
        if self._tx is None:
            self._tx = self.conn.transaction()
            await self._tx.start()
        if pending.skips:
            pending = await self._leave_out(pending)
        self._round_xids.update(pending.xids)
        ends = sorted(self._round_xids) if to is not None else None
        n = await self._append(self.lsn, to if to is not None else self.lsn, committed_at, pending, ends or None)
        self.events += n
        self._round += n
        if to is None:
            return
        await self._tx.commit()
        self._tx = None
        self._round_xids.clear()
        if self._failing is not None:
            await self.conn.execute(sql.query("wal_recovered"))
            log.info("WAL capture: appending again")
            self._failing = None
        if self._round and self.observe is not None:
            self.observe(self._round)
        self._round = 0
        self.lsn = max(self.lsn, to)
        self.confirm(stream, self.lsn)

    async def _leave_out(self, pending: _Pending) -> _Pending:
        """``pending`` without the changes at a position the operator chose to skip (ferry.skip_wal_change)
        that the log cannot hold, each recorded as a gap of its readers (ferry._record_wal_skip) in the
        open round: the gaps commit with the append that leaves the changes out, or neither does."""
        at = [i for i, _ in pending.skips]
        p = pending
        left = await self.conn.fetchval(
            sql.query("wal_skip"),
            [_lsn_text(p.lsns[i]) for i in at], [p.relids[i] for i in at], [p.ops[i] for i in at],
            [p.rows[i].decode() for i in at], [None if (old := p.olds[i]) is None else old.decode() for i in at],
            [keys for _, keys in p.skips], [p.times[i] for i in at],
        )  # fmt: skip
        out = {i for i, gone in zip(at, left, strict=True) if gone}
        if not out:
            return pending
        kept = _Pending()
        for i in range(len(p.ops)):
            if i in out:
                log.warning("WAL capture: the change of %s at %s, which the log cannot hold, is left out "
                            "(ferry.skip_wal_change) and recorded as a gap of its readers (ferry.gaps)",
                            self._table_name(p.relids[i]), _lsn_text(p.lsns[i]))  # fmt: skip
            else:
                _append(kept, p.relids[i], p.ops[i], p.rows[i], p.olds[i], p.missing[i], p.times[i], p.lsns[i],
                        p.xids[i])  # fmt: skip
        return kept

    def confirm(self, stream: ReplicationStream, lsn: int) -> None:
        """Tell the server everything committed before ``lsn`` is in the log (after the commit)."""
        stream.confirm(lsn)

    async def _report_lost(self, slot: asyncpg.Record) -> None:
        """A slot PostgreSQL invalidated (or someone dropped): changes are gone. Say so once, where
        status shows it, with the way out, and as a gap of each consumer reading what WAL capture
        writes (ferry._record_wal_loss)."""
        if self._reported_lost == slot["problem"]:
            return
        self._reported_lost = slot["problem"]
        note = await self.conn.fetchval(sql.query("wal_slot_lost"), slot["problem"])
        log.error("WAL capture stopped: %s", note)

    async def _append(
        self, at: int, to: int, committed_at: datetime | None, pending: _Pending, round_xids: list[int] | None
    ) -> int:
        """``ferry._append_wal_v2``; ``round_xids`` (the round's source transactions) ends the round."""
        p = pending
        self._failed = p  # the changes to name should this fail
        base = db.command_timeout(self.conn)
        timeout = None if base is None else base + p.size / (1 << 20) * self.settings.append_seconds_per_mb
        try:
            n = await self.conn.fetchval(
                sql.query("wal_append"),
                _lsn_text(at), _lsn_text(to), committed_at, p.relids, p.ops, p.rows, p.olds, p.missing, p.times,
                p.lsns, p.xids, round_xids, timeout=timeout,
            )  # fmt: skip
        except TimeoutError:
            assert timeout is not None
            raise AppendTimedOut(p.size, timeout, p.relids) from None
        return int(n)

    def _add(self, pending: _Pending, change: Change, commit_time: datetime | None, lsn: int, xid: int) -> None:
        rel = self.relations.get(change.relation)
        if rel is None:
            raise ReplicationError(f"pgoutput sent a change of relation {change.relation} before describing it")
        old = change.old if not change.old_is_key else None
        if change.op == "D":
            assert change.old is not None
            row, missing = _row(rel, change.old, None)
            _append(pending, change.relation, "D", row, None, missing, commit_time, lsn, xid)
        else:
            assert change.new is not None
            row, missing = _row(rel, change.new, old)
            old_row = _row(rel, old, None)[0] if old is not None else None
            _append(pending, change.relation, change.op, row, old_row, missing, commit_time, lsn, xid)
        if lsn in self._skip:  # the operator chose to skip the change here, if the log cannot hold it
            values = change.old if change.op == "D" else change.new
            keys = {c.name: v for c, v in zip(rel.columns, values or (), strict=False) if v is not UNCHANGED}
            pending.skips.append((len(pending.ops) - 1, orjson.dumps(keys)))


def _append(
    pending: _Pending, rel: int, op: str, row: bytes, old: bytes | None, missing: bytes | None, at: datetime | None,
    lsn: int, xid: int,
) -> None:  # fmt: skip
    pending.relids.append(rel)
    pending.ops.append(op)
    pending.rows.append(row)
    pending.olds.append(old)
    pending.missing.append(missing)
    pending.times.append(at or datetime.now(UTC))
    pending.lsns.append(lsn)
    pending.xids.append(xid)
    pending.size += len(row) + (len(old) if old is not None else 0) + (len(missing) if missing is not None else 0)


def _row(rel: Relation, values: list[object], old: list[object] | None) -> tuple[bytes, bytes | None]:
    """The row as a JSON object of column => value, as ``to_jsonb`` writes the types it can
    from their text (numbers, booleans, json) and text otherwise (the database converts those,
    ferry._append_wal_v2). An unchanged TOASTed value is taken from the old row when the WAL has
    it, and listed as missing if not."""
    names, json_at, number_at, bool_at = _shape(rel)
    missing: list[str] = []
    values = list(values)
    if UNCHANGED in values:
        for i, value in enumerate(values):
            if value is UNCHANGED:
                before = old[i] if old is not None and i < len(old) else UNCHANGED
                values[i] = before
                if before is UNCHANGED:
                    missing.append(names[i])
    for i in json_at:
        text = values[i]
        if isinstance(text, str):
            values[i] = orjson.Fragment(text)
    for i in number_at:  # NaN and the infinities are strings in JSON, as to_jsonb writes them
        text = values[i]
        if isinstance(text, str) and text not in NOT_JSON_NUMBERS:
            values[i] = orjson.Fragment(text)
    for i in bool_at:
        text = values[i]
        if isinstance(text, str):
            values[i] = text == "t"
    row = dict(zip(names, values, strict=True))
    for name in missing:
        del row[name]
    return orjson.dumps(row), orjson.dumps(missing) if missing else None


def _shape(rel: Relation, json_types: frozenset[int] = JSON_TYPES) -> tuple[list[str], list[int], list[int], list[int]]:
    """A relation's column names and where its json, number and boolean columns are (kept on it)."""
    if rel.shape is None:
        at = {kind: [i for i, c in enumerate(rel.columns) if c.type_oid in types]
              for kind, types in (("json", json_types), ("number", NUMBER_TYPES), ("bool", {BOOL}))}  # fmt: skip
        rel.shape = ([c.name for c in rel.columns], at["json"], at["number"], at["bool"])
    return rel.shape


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
