"""Subscriptions and the events that travel to them, as the delivery engine sees them."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg


def utf8_length(text: str) -> int:
    """``text``'s length in UTF-8 bytes (PostgreSQL's octet_length, what Redis stores): no copy for
    ASCII text (``isascii`` is O(1)). Counted in characters, non-ASCII text counts up to 4x short."""
    return len(text) if text.isascii() else len(text.encode())


def consumer_name(subscription: str, part: int = 0, parts: int = 1) -> str:
    """Each subscription reads the log through its own consumer, one per partition (as
    ferry._partition_consumer names them, migration 0018)."""
    return f"webhook:{subscription}" if parts <= 1 else f"webhook:{subscription}#{part}/{parts}"


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    streams: tuple[str, ...]
    url: str
    headers: dict[str, str]
    secrets: tuple[str, ...] = field(repr=False)  # signing secrets never end up in a log line or traceback
    batch_size: int
    max_in_flight: int
    ordered: bool
    timeout_ms: int
    connect_timeout_ms: int
    max_attempts: int
    max_age: timedelta
    retry_base_ms: int
    retry_max_ms: int
    state: str
    updated_at: datetime
    kind: str = "webhook"  # or "pg_net": each event is a request of its own (net.http_* API)
    #: which partition of how many this is (a relay delivers partitions as units, migration 0018)
    part: int = 0
    parts: int = 1
    #: after a change of partitions: an old partition reading up to its drain tick ...
    draining: bool = False
    #: ... that got there (its owner stops it and removes it) ...
    drained: bool = False
    #: ... and a new one, which reads and retries nothing while an old one remains
    waiting: bool = False
    #: a broker's user/password, token or creds file (ferry.set_subscription_credentials): never shown
    credentials: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def consumer(self) -> str:
        return consumer_name(self.name, self.part, self.parts)

    @property
    def generation(self) -> tuple[str, int]:
        """The subscription and its number of partitions: the partitions delivered together."""
        return self.name, self.parts

    @property
    def unit(self) -> str:
        """What a relay delivers, as logs and ferry.relays.owned name it: the subscription, or one
        of its partitions ("orders#2/4")."""
        return self.name if self.parts <= 1 else f"{self.name}#{self.part}/{self.parts}"

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Subscription:
        return cls(
            name=row["name"],
            streams=tuple(row["streams"]),
            url=row["url"],
            headers=dict(row["headers"] or {}),
            secrets=tuple(row["secrets"] or ()),
            batch_size=row["batch_size"],
            max_in_flight=row["max_in_flight"],
            ordered=row["ordered"],
            timeout_ms=row["timeout_ms"],
            connect_timeout_ms=row["connect_timeout_ms"],
            max_attempts=row["max_attempts"],
            max_age=row["max_age"],
            retry_base_ms=row["retry_base_ms"],
            retry_max_ms=row["retry_max_ms"],
            state=row["state"],
            updated_at=row["updated_at"],
            kind=row.get("kind", "webhook"),
            # a ferry.relay_round row says which unit; a plain ferry.subscriptions row is the whole one
            part=row.get("part", 0),
            parts=row.get("parts", 1),
            draining=row.get("draining", False),
            drained=row.get("drained", False),
            waiting=row.get("waiting", False),
            credentials=dict(row.get("credentials") or {}),
        )


@functools.lru_cache(maxsize=64)
def _utc(text: str) -> datetime:
    """PostgreSQL's text of a UTC timestamp (DateStyle ISO) as an aware datetime, parsed once for
    the events of a transaction (they share it) while they come."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@dataclass(slots=True)
class OutEvent:
    """An event on its way out. The payload stays raw JSON text: it is sent as is."""

    id: int
    stream: str
    key: str | None
    payload: str
    headers: str | None
    created_at: datetime
    attempts: int = 0  # attempts already made (parked events)
    first_failed_at: datetime | None = None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> OutEvent:
        return cls(
            id=row["id"],
            stream=row["stream"],
            key=row["key"],
            payload=row["payload"],
            headers=row["headers"],
            created_at=row["created_at"],
            attempts=row.get("attempts", 0),
            first_failed_at=row.get("first_failed_at"),
        )

    @classmethod
    def from_batch_row(cls, row: asyncpg.Record) -> OutEvent:
        """An event of a ``webhook_steps`` read: ``created_at`` is UTC text (sql/queries.sql). Half
        the cost of ``from_row`` (no keywords, no optional columns), which a batch pays per event."""
        return cls(row["id"], row["stream"], row["key"], row["payload"], row["headers"], _utc(row["created_at"]))

    def header_map(self) -> dict[str, Any]:
        """The event's headers, numbers exact (an int of any size, a decimal as ``Decimal``): orjson
        read 12345678901234567890123 as a float, sent to JetStream as 1.2345678901234568e+22 (outside
        probe)."""
        try:
            value = json.loads(self.headers, parse_float=Decimal) if self.headers else {}
        except RecursionError:  # stored fine by PostgreSQL, deeper than Python decodes
            raise ValueError("nested too deep") from None
        if not isinstance(value, dict):
            raise ValueError(f"headers are a JSON {type(value).__name__}, not an object")
        return value
