"""Stream offsets: where an event sits in commit order, stable and resumable.

Event ids are drawn when a row is inserted, not when its transaction
commits, so "everything after id N" would skip a slower transaction's
smaller id that commits later. The log's ticks are what orders commits:
each tick is a snapshot, and an event's *commit tick* is the first tick
whose snapshot sees its transaction committed. ``Offset(tick, id)`` orders
events by commit tick, then id: the same for every reader, whatever ranges
it reads the log in, so a reader (or a browser's EventSource, across relay
restarts) can resume after any offset it was given. Offsets are not dense
and cost writers nothing: nothing is numbered at write time.

The commit tick of an event read in a range of ticks is found in Python,
from the ticks' snapshots (``pgferry.log.ticks.commit_ticks``): PostgreSQL
would test each event against each tick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgferry.errors import PgferryError

_OFFSET = re.compile(r"^(\d{1,18})-(\d{1,18})\Z")


class BadOffset(PgferryError, ValueError):
    """Not an offset pgferry gave out."""


@dataclass(frozen=True, order=True, slots=True)
class Offset:
    """After ``Offset(tick, id)``: the events whose commit tick is later, or the same with a larger id."""

    tick: int
    id: int

    def __str__(self) -> str:
        return f"{self.tick}-{self.id}"

    @classmethod
    def parse(cls, text: str) -> Offset:
        match = _OFFSET.match(text) if isinstance(text, str) else None
        if match is None:
            raise BadOffset(f"{str(text)[:60]!r} is not a stream offset (they look like 1234-56789)")
        return cls(int(match[1]), int(match[2]))
