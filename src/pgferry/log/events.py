"""What a reader gets out of the log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    stream: str
    key: str | None
    payload: Any
    headers: dict[str, Any] | None
    txid: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Event:
        return cls(
            id=row["id"],
            stream=row["stream"],
            key=row["key"],
            payload=row["payload"],
            headers=row["headers"],
            txid=row["txid"],
            created_at=row["created_at"],
        )


@dataclass(slots=True)
class Batch:
    """Every event (of the consumer's streams) committed between two ticks, in commit order: by
    the tick each committed in, then by id.

    Acknowledge it with ``await batch.ack()`` once processed; until then the
    consumer is handed the same batch again (also after a crash).
    """

    id: int
    consumer: str
    start_tick: int
    end_tick: int
    events: list[Event]
    _ack: Callable[[Batch], Awaitable[bool]] = field(repr=False)
    acked: bool = False

    async def ack(self) -> bool:
        """Mark the batch done. Returns False when the connection dropped first:
        the batch is then handed out again after the reader reconnects."""
        if not self.acked:
            self.acked = await self._ack(self)
        return self.acked

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.events)
