"""Errors pgferry raises on purpose. Each message says what went wrong and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg


def one_line(exc: BaseException) -> str:
    """A PostgreSQL error as one line: its message, then its detail and hint. asyncpg's str()
    already holds them, each on a line of its own, so adding the hint to it said it twice. A part
    written as a sentence (capitalized) follows as one; a lower-case part follows a semicolon."""
    line = getattr(exc, "message", None) or str(exc)
    for part in (getattr(exc, "detail", None), getattr(exc, "hint", None)):
        if part:
            sentence = part[:1].isupper()
            line += (" " if line.endswith((".", "!", "?")) else ". ") if sentence else "; "
            line += part
    return line


#: PostgreSQL's refusals of an interval's text, and what one looks like (the CLI's options and apply's max_age)
INTERVAL_REFUSALS = ("type interval", "interval field value out of range", "interval out of range")
INTERVAL_HINT = "give a PostgreSQL interval such as '3 days', '36 hours' or '90 minutes'"


class PgferryError(Exception):
    """Base class for every error pgferry raises deliberately."""


class DatabaseUnreachable(PgferryError):
    """The database URL is malformed, or PostgreSQL cannot be reached with it."""


class SchemaMissing(PgferryError):
    """The ferry schema is not installed, or is older than this pgferry."""


class InvalidEvent(PgferryError, ValueError):
    """An event given to publish() cannot be stored (e.g. payload is not JSON)."""


class EventRefused(PgferryError):
    """The database refused an event in its current state, e.g. one for a stream closed with close_stream()."""


class EmbeddedPostgresError(PgferryError):
    """The throwaway local PostgreSQL could not be started."""


class InvalidTokenPattern(PgferryError, ValueError):
    """An API token's stream pattern is empty, too long or holds a control character."""


class TokenStoreUnavailable(PgferryError):
    """The API tokens could not be loaded from the database: no request can be authorized (answer 503)."""


class InvalidBackfill(PgferryError, ValueError):
    """A backfill cannot be started or changed as asked (table not captured, bad condition, unknown target...)."""


class ConsumerStalled(PgferryError):
    """Retention dropped events this consumer had not read (it fell behind ``ferry.config.max_retention``
    or the size cap): reading on means acknowledging the gap with ``Ferry.resume_consumer``."""

    #: SQLSTATE of ferry.next_batch for a stalled consumer with a gap (migration 0014)
    SQLSTATE = "PF002"

    def __init__(self, consumer: str, message: str) -> None:
        super().__init__(message)
        self.consumer = consumer


class CaptureWarning(UserWarning):
    """A capture that will not see some writes of its table (e.g. a partitioned table by trigger)."""


class PermissionDenied(PgferryError):
    """PostgreSQL refused a statement for want of a privilege the role could be granted (``denied``
    is its error: the CLI names the role and the grant)."""

    def __init__(self, message: str, denied: asyncpg.InsufficientPrivilegeError) -> None:
        super().__init__(message)
        self.denied = denied
