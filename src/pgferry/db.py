"""Connections to PostgreSQL, with errors that name the problem.

Every connection pgferry opens goes through here so that JSON is encoded the
same way everywhere (orjson, binary jsonb) and a bad URL never surfaces as a
bare socket error.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from pgferry.errors import DatabaseUnreachable

URL_ENV_VAR = "PGFERRY_DATABASE_URL"
CONNECT_TIMEOUT_S = 10.0


#: Errors after which a long-running loop reconnects (with backoff) instead of failing.
CONNECTION_ERRORS = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    DatabaseUnreachable,
)


def redact(url: str) -> str:
    """The URL with any password replaced, safe to print and log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str) -> None:
    """Reject URLs that are not PostgreSQL URLs before trying to connect."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise DatabaseUnreachable(
            f"database URL {redact(url)!r} is not a PostgreSQL URL; "
            "expected postgresql://user:password@host:5432/dbname"
        )


def _encode_jsonb(value: Any) -> bytes:
    # Pre-encoded JSON (bytes) passes through; everything else goes via orjson.
    if isinstance(value, bytes | bytearray | memoryview):
        return b"\x01" + bytes(value)
    return b"\x01" + orjson.dumps(value)


class RawJSON(str):
    """JSON text pgferry could not turn into Python objects, handed over as it is.

    PostgreSQL stores JSON nested far deeper (thousands of levels) than orjson
    decodes (1024). Such a value, published from SQL, must not make a reader
    fail on its batch forever: it arrives as this ``str`` subclass holding the
    exact JSON text, for the consumer to decode (or reject) as it sees fit.
    """

    __slots__ = ()


def _decode_jsonb(data: bytes) -> Any:
    try:
        return orjson.loads(data[1:])
    except orjson.JSONDecodeError:
        return RawJSON(bytes(data[1:]).decode())


async def init_connection(conn: asyncpg.Connection) -> None:
    """Per-connection setup: fast binary jsonb via orjson."""
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        format="binary",
    )


def _explain(url: str, exc: BaseException) -> DatabaseUnreachable:
    where = redact(url)
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        reason = f"authentication failed ({exc})"
    elif isinstance(exc, asyncpg.InvalidCatalogNameError):
        reason = f"the database does not exist ({exc})"
    elif isinstance(exc, asyncio.TimeoutError | TimeoutError):
        reason = f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    elif isinstance(exc, OSError):
        reason = f"{exc.strerror or exc} (is PostgreSQL running and listening there?)"
    else:
        reason = str(exc) or type(exc).__name__
    return DatabaseUnreachable(
        f"cannot connect to PostgreSQL at {where}: {reason}. Check --database-url or {URL_ENV_VAR}."
    )


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    """Open one connection, or raise DatabaseUnreachable saying why not."""
    check_url(url)
    try:
        conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S, **kwargs)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        raise _explain(url, exc) from exc
    await init_connection(conn)
    return conn


async def rollback_if_open(conn: asyncpg.Connection) -> None:
    """A pool ``reset`` for connections that never keep session state (LISTEN, advisory
    locks, SET, temporary tables): asyncpg's default reset costs a round trip on every
    release, which for the relay's delivery loop was one in every two round trips."""
    if conn.is_in_transaction():
        await conn.execute("rollback")


async def create_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    server_settings: dict[str, str] | None = None,
    stateless: bool = False,
) -> asyncpg.Pool:
    """Open a connection pool, or raise DatabaseUnreachable saying why not.

    ``stateless``: the caller promises not to leave session state on pooled
    connections, so releasing one skips asyncpg's reset round trip."""
    check_url(url)
    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_S,
            init=init_connection,
            server_settings=server_settings,
            reset=rollback_if_open if stateless else None,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        raise _explain(url, exc) from exc
    assert pool is not None
    return pool


def url_from_env() -> str | None:
    return os.environ.get(URL_ENV_VAR) or None
