"""pgferry: events out of PostgreSQL, reliably and in real time."""

from pgferry.api import Ferry, connect
from pgferry.db import RawJSON
from pgferry.errors import DatabaseUnreachable, InvalidEvent, PgferryError, SchemaMissing
from pgferry.log.events import Batch, Event

__all__ = [
    "Batch",
    "DatabaseUnreachable",
    "Event",
    "Ferry",
    "InvalidEvent",
    "PgferryError",
    "RawJSON",
    "SchemaMissing",
    "connect",
]
__version__ = "0.1.0"
