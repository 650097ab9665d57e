"""Ticks' snapshots, and the tick each transaction committed in.

A tick is a snapshot of the log (ferry.ticks); an event's *commit tick* is the
first tick whose snapshot sees its transaction committed, which is what orders
events by commit across every way they reach the log (a trigger, a publish,
WAL capture appending under the source transaction's id: migration 0028).
Readers find it here, in Python, from the snapshots of the ticks of the range
they read: PostgreSQL would test each event against each tick.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from pgferry import sql


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A tick's pg_snapshot: transactions below xmin, or below xmax and not in xip, had committed."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def sees(self, txid: int) -> bool:
        return txid < self.xmin or (txid < self.xmax and txid not in self.xip)


def commit_ticks(txids: Sequence[int], ticks: Sequence[tuple[int, Snapshot]]) -> list[int | None]:
    """For each committed transaction id, the first of ``ticks`` (ascending) whose snapshot sees it,
    or None when none does. Snapshots only ever see more, and their xmax never goes down: a
    bisection finds the first tick the transaction had started before, and the few ticks it
    was still running at follow."""
    xmaxes = [snapshot.xmax for _, snapshot in ticks]
    found: list[int | None] = []
    for txid in txids:
        k = bisect_right(xmaxes, txid)
        while k < len(ticks) and txid in ticks[k][1].xip:
            k += 1
        found.append(ticks[k][0] if k < len(ticks) else None)
    return found


async def range_ticks(conn: asyncpg.Connection, lower: int, end: int) -> list[tuple[int, Snapshot]]:
    """The ticks of the range (lower, end] with their snapshots, to find each event's commit tick."""
    return [(t["id"], Snapshot.parse(t["snapshot"])) for t in await conn.fetch(sql.query("stream_ticks"), lower, end)]
