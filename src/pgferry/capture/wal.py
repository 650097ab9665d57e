"""WAL capture: decode the logical replication slot into ``ferry.events``, exactly once.

Runs on the relay holding the WAL capture lock (relay/leader.py), on that lock's
connection. One step, in one transaction:

1. ``e0`` := the WAL flushed so far; the slot is peeked (not consumed) up to it, through
   a cursor, so that a million-row transaction streams in chunks instead of landing in
   memory at once;
2. transactions committed before ``ferry.wal_slot.lsn`` are skipped: they are in the log
   already (a relay that died between its commit and step 3);
3. the rest are decoded (capture/pgoutput.py) and appended by ``ferry._append_wal``,
   which also moves ``ferry.wal_slot.lsn`` to ``e0`` (or to the end of the last whole
   transaction read, when the step stopped early): events and position commit together;
4. after the commit, and only then, the slot is advanced to that position, so PostgreSQL
   may recycle the WAL behind it.

A crash anywhere repeats at most step 1-3 of one round, whose changes step 2 then skips:
no loss, no duplicate. The slot advances while the captured tables are idle and other
tables write (step 4 runs every round), so an idle capture never holds WAL back.

Why the SQL functions (``pg_logical_slot_peek_binary_changes``) and not the streaming
replication protocol: asyncpg cannot speak it, psycopg 3 does not, psycopg2 does but only
on a blocking connection of its own; the SQL interface runs on the relay's asyncpg
connection, inside the very transaction that appends the events, with no new dependency.
What it costs: a poll (``poll_interval`` while idle, none while busy) instead of a push,
and each peek decodes again from the slot's restart point, which a long-running writer
transaction holds back (docs/capture.md says more).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import orjson

from pgferry import sql
from pgferry.aio import wait_for_event
from pgferry.capture.pgoutput import UNCHANGED, Begin, Change, Commit, Relation, Truncate, decode

log = logging.getLogger(__name__)

#: json and jsonb: their text is JSON already, and goes into the row object as JSON.
JSON_TYPES = frozenset({114, 3802})


@dataclass
class WalSettings:
    poll_interval: float = 0.05
    #: messages a step asks the slot for (it stops at the first transaction boundary after)
    max_changes: int = 50_000
    #: messages fetched from the cursor, and changes appended, at a time
    chunk: int = 5_000
    #: how often a missing or invalidated slot is looked at again
    recheck_interval: float = 5.0


@dataclass
class _Pending:
    """Changes decoded and not yet appended, as the arrays ferry._append_wal takes."""

    relids: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    rows: list[bytes] = field(default_factory=list)
    olds: list[bytes | None] = field(default_factory=list)
    missing: list[bytes | None] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)

    def clear(self) -> None:
        for values in (self.relids, self.ops, self.rows, self.olds, self.missing, self.times):
            values.clear()


@dataclass
class StepResult:
    events: int = 0
    transactions: int = 0
    more: bool = False  # the step stopped early: run the next at once


class WalCapture:
    """Decodes the slot into the log until ``stop`` is set or the connection fails."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        settings: WalSettings | None = None,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        self.conn = conn
        self.settings = settings or WalSettings()
        self.relations: dict[int, Relation] = {}
        self.events = 0
        #: metrics hook: events appended by a step
        self.observe = observe
        self._reported_lost: str | None = None
        self._advanced: str | None = None  # where this process last advanced the slot to
        self._caught_up = 0.0  # monotonic time ferry.wal_slot.caught_up_at was last written

    async def run(self, stop: asyncio.Event) -> None:
        # The append must be durable before the slot moves past it: never synchronous_commit off here.
        await self.conn.execute("set synchronous_commit = on")
        while not stop.is_set():
            slot = await self.conn.fetchrow(sql.query("wal_slot"))
            if slot is None:  # nothing is captured from the WAL
                await wait_for_event(stop, self.settings.recheck_interval)
                continue
            if slot["problem"] is not None:
                await self._report_lost(slot)
                await wait_for_event(stop, self.settings.recheck_interval)
                continue
            self._reported_lost = None
            result = await self.step(slot["slot_name"], slot["publication"], slot["lsn"])
            if result.events and self.observe is not None:
                self.observe(result.events)
            if not result.more:
                await wait_for_event(stop, self.settings.poll_interval)

    async def _report_lost(self, slot: asyncpg.Record) -> None:
        """A slot PostgreSQL invalidated (or someone dropped): changes are gone. Say so once,
        where status shows it, with the way out."""
        if self._reported_lost == slot["problem"]:
            return
        self._reported_lost = slot["problem"]
        note = (
            f"{slot['problem']}: changes committed after {slot['lsn']} are not in the log. "
            "Run select ferry.reset_wal_slot(); then `pgferry backfill` each table captured with method 'wal'"
        )
        await self.conn.execute(sql.query("wal_slot_lost"), note)
        log.error("WAL capture stopped: %s", note)

    async def step(self, slot: str, publication: str, lsn: str) -> StepResult:
        """One round: peek, skip what the log has, append the rest with the new position, then
        advance the slot. Returns what it did."""
        s = self.settings
        conn = self.conn
        result = StepResult()
        pending = _Pending()
        skip = False
        commit_time: datetime | None = None
        last_end: int | None = None
        messages = 0
        async with conn.transaction():
            e0 = await conn.fetchval("select pg_current_wal_flush_lsn()::text")
            cursor = await conn.cursor(sql.query("wal_peek"), slot, e0, s.max_changes, publication)
            at = _lsn(lsn)
            while True:
                rows = await cursor.fetch(s.chunk)
                if not rows:
                    break
                messages += len(rows)
                for row in rows:
                    m = decode(row[0])
                    if isinstance(m, Change):
                        if not skip:
                            self._add(pending, m, commit_time)
                    elif isinstance(m, Relation):
                        self.relations[m.oid] = m
                    elif isinstance(m, Begin):
                        skip = m.final_lsn < at
                        commit_time = datetime.fromtimestamp(m.commit_time_us / 1e6, UTC)
                    elif isinstance(m, Commit):
                        last_end = m.end_lsn
                        if not skip:
                            result.transactions += 1
                    elif isinstance(m, Truncate) and not skip:
                        for rel in m.relations:
                            _append(pending, rel, "T", b"{}", None, None, commit_time)
                if len(pending.ops) >= s.chunk:
                    result.events += await self._append(lsn, lsn, None, pending)
            result.more = messages >= s.max_changes and last_end is not None
            to = _lsn_text(last_end) if result.more and last_end is not None else e0
            # A round that found nothing for the log leaves ferry.wal_slot alone (only the slot
            # moves): writing the position would itself write WAL, and so make work for the next
            # round forever. A position that lags is safe: it only says what to skip.
            if result.transactions or pending.ops:
                result.events += await self._append(lsn, to, commit_time, pending)
                self._caught_up = time.monotonic()
            elif time.monotonic() - self._caught_up >= 1.0:
                await conn.execute(sql.query("wal_caught_up"))
                self._caught_up = time.monotonic()
        # Only now that the events are committed may PostgreSQL forget those changes.
        if to != self._advanced:
            await self.advance(slot, to)
            self._advanced = to
        return result

    async def advance(self, slot: str, to: str) -> None:
        """Confirm the slot up to ``to``: PostgreSQL may then recycle the WAL before it."""
        await self.conn.execute(sql.query("wal_advance"), slot, to)

    async def _append(self, at: str, to: str, committed_at: datetime | None, pending: _Pending) -> int:
        p = pending
        n = await self.conn.fetchval(
            sql.query("wal_append"), at, to, committed_at, p.relids, p.ops, p.rows, p.olds, p.missing, p.times
        )
        pending.clear()
        self.events += n
        return int(n)

    def _add(self, pending: _Pending, change: Change, commit_time: datetime | None) -> None:
        rel = self.relations.get(change.relation)
        if rel is None:
            raise RuntimeError(f"pgoutput sent a change of relation {change.relation} before describing it")
        old = change.old if not change.old_is_key else None
        if change.op == "D":
            assert change.old is not None
            row, missing = _row(rel, change.old, None)
            _append(pending, change.relation, "D", row, None, missing, commit_time)
            return
        assert change.new is not None
        row, missing = _row(rel, change.new, old)
        old_row = _row(rel, old, None)[0] if old is not None else None
        _append(pending, change.relation, change.op, row, old_row, missing, commit_time)


def _append(
    pending: _Pending, rel: int, op: str, row: bytes, old: bytes | None, missing: bytes | None, at: datetime | None
) -> None:
    pending.relids.append(rel)
    pending.ops.append(op)
    pending.rows.append(row)
    pending.olds.append(old)
    pending.missing.append(missing)
    pending.times.append(at or datetime.now(UTC))


def _row(rel: Relation, values: list[object], old: list[object] | None) -> tuple[bytes, bytes | None]:
    """The row as a JSON object of column => text (JSON for json/jsonb columns); an unchanged
    TOASTed value is taken from the old row when the WAL has it, and listed as missing if not."""
    parts: list[bytes] = []
    missing: list[str] = []
    for i, col in enumerate(rel.columns):
        value = values[i] if i < len(values) else None
        if value is UNCHANGED:
            value = old[i] if old is not None and i < len(old) else UNCHANGED
            if value is UNCHANGED:
                missing.append(col.name)
                continue
        name = orjson.dumps(col.name)
        if value is None:
            parts.append(name + b":null")
        elif col.type_oid in JSON_TYPES:
            parts.append(name + b":" + str(value).encode())
        else:
            parts.append(name + b":" + orjson.dumps(value))
    return b"{" + b",".join(parts) + b"}", orjson.dumps(missing) if missing else None


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
