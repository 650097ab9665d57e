"""pgferry: events out of PostgreSQL, reliably and in real time."""

from pgferry.api import Ferry, connect
from pgferry.db import RawJSON
from pgferry.errors import (
    ConsumerStalled,
    DatabaseUnreachable,
    EventRefused,
    InvalidEvent,
    PgferryError,
    SchemaMissing,
)
from pgferry.log.events import Batch, Event
from pgferry.streams.offsets import BadOffset, Offset
from pgferry.streams.reader import OffsetAhead, OffsetExpired, StreamEvent

__all__ = [
    "BadOffset",
    "Batch",
    "ConsumerStalled",
    "DatabaseUnreachable",
    "Event",
    "EventRefused",
    "Ferry",
    "InvalidEvent",
    "Offset",
    "OffsetAhead",
    "OffsetExpired",
    "PgferryError",
    "RawJSON",
    "SchemaMissing",
    "StreamEvent",
    "connect",
]
__version__ = "0.1.0"
