"""Connections to PostgreSQL, with errors that name the problem.

Every connection pgferry opens goes through here so that JSON is encoded the
same way everywhere (orjson, binary jsonb) and a bad URL never surfaces as a
bare socket error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg
import orjson

from pgferry.errors import DatabaseUnreachable, one_line

URL_ENV_VAR = "PGFERRY_DATABASE_URL"
CONNECT_TIMEOUT_S = 10.0


#: Longest wait between the relay's attempts to reconnect. A refused connection
#: costs PostgreSQL nothing, and the relay delivers nothing until it is back, so
#: the backoff stays short: with the former 10 s cap, delivery resumed 6.2 s after
#: a 5 s outage ended (tests/faults/test_postgres_restart.py); with 2 s, 0.5-0.7 s.
RECONNECT_BACKOFF_CAP = 2.0

#: Errors after which a long-running loop reconnects (with backoff) instead of failing.
#: InternalClientError is among them: when the server ends a session on its own (a
#: shutdown or restart sends FATAL to idle connections), a query sent in that moment
#: fails with "cannot switch to state ...; another operation (2) is in progress" and the
#: connection is gone (seen in tests/faults/test_postgres_restart.py).
CONNECTION_ERRORS = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    DatabaseUnreachable,
)


#: see Liveness.delivery_timeout
DELIVERY_TIMEOUT_FACTOR = 6
#: How often (ms) PostgreSQL checks, during a statement, that a lock-holding relay is still there
CLIENT_CHECK_MS = 1000


@dataclass(frozen=True)
class Liveness:
    """How long a relay connection may go silent before someone gives up on it, on both ends.

    A connection that is cut is noticed at once (an error on the next read or
    write). One that goes *silent* is not: behind a network partition, a stuck
    proxy or a failed-over address, a query waits for its answer forever, and
    PostgreSQL keeps the backend on the other end alive with the session
    advisory locks it holds (the ticker's, the subscriptions'), so no other
    relay can take over either. TCP keepalives do not help when the silent hop
    is a proxy that still acknowledges packets. So both ends set a deadline:

    * the relay gives every statement ``command_timeout`` seconds, then drops
      the connection and reconnects (asyncpg's ``command_timeout``);
    * PostgreSQL ends a lock-holding relay session that has been idle for
      ``session_timeout`` seconds (``idle_session_timeout``; those sessions
      speak every few seconds when healthy), and any relay session idle inside
      a transaction that long (``idle_in_transaction_session_timeout``), which
      frees the locks of a relay that was cut off;
    * and a lock-holding session whose relay died in the middle of a statement
      (a SIGKILLed leader appending a chunk of WAL changes on a busy machine)
      is ended within a second (``client_connection_check_interval``): without
      it the backend finished the statement first, and a standby took over WAL
      capture ~10 s after the SIGKILL instead of ~1 s (a CI run).
    """

    command_timeout: float = 10.0
    #: longer than command_timeout plus the relay's longest healthy pause (claim_interval):
    #: a relay cut off gives up on its locks before PostgreSQL hands them to another relay
    session_timeout: float = 30.0

    @property
    def delivery_timeout(self) -> float:
        """The deadline of the relay's delivery statements, DELIVERY_TIMEOUT_FACTOR x command_timeout:
        on a busy database a catch-up's first read or the recording of thousands of attempts can
        outlast command_timeout, and cutting it off only makes the worker start over and send what
        it had in hand again (13,000-21,000 duplicates after a 60-90 s outage, outside probe). They
        hold no lock, so a silent connection costs only its worker this long."""
        return self.command_timeout * DELIVERY_TIMEOUT_FACTOR

    def connect_kwargs(self, application_name: str, *, holds_locks: bool) -> dict[str, Any]:
        """Keyword arguments for :func:`connect` / :func:`create_pool`."""
        idle_ms = str(max(1, round(self.session_timeout * 1000)))
        settings = {"application_name": application_name, "idle_in_transaction_session_timeout": idle_ms}
        if holds_locks:
            settings["idle_session_timeout"] = idle_ms
            settings["client_connection_check_interval"] = str(CLIENT_CHECK_MS)
        return {"command_timeout": self.command_timeout, "server_settings": settings}


#: scheme://user: and everything up to the last @: a password that holds /, ?, # or @ unencoded
#: ends urlsplit's netloc early, so it found no password and the URL was printed whole.
_USER_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*:)(.*)@([^@]*)$", re.DOTALL)


def command_timeout(conn: asyncpg.Connection) -> float | None:
    """The ``command_timeout`` ``conn`` was opened with (None: none), which a statement's own
    ``timeout=`` replaces."""
    timeout = conn._config.command_timeout
    return None if timeout is None else float(timeout)


def redact(url: str) -> str:
    """The URL with any password replaced, safe to print and log (also when it is malformed, or its
    password holds characters that should have been percent-encoded)."""
    return _USER_PASSWORD.sub(r"\1***@\3", url)


def describe(exc: BaseException) -> str:
    """Why a connection was given up, for the log (a timeout's own text is empty)."""
    if isinstance(exc, TimeoutError):
        return "no answer in time (command_timeout)"
    return str(exc) or type(exc).__name__


_EXPECTED = "expected postgresql://user:password@host:5432/dbname"


def check_url(url: str) -> None:
    """Reject URLs that are not PostgreSQL URLs, or are malformed, before trying to connect: asyncpg
    answered a port past 65535 with an OverflowError and an unclosed IPv6 bracket with a ValueError,
    both as tracebacks (outside review)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise DatabaseUnreachable(f"database URL {redact(url)!r} is malformed ({exc}); {_EXPECTED}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise DatabaseUnreachable(f"database URL {redact(url)!r} is not a PostgreSQL URL; {_EXPECTED}")
    if "@" not in parts.netloc and _USER_PASSWORD.match(url):  # user:pa/ss@host: the host part ended at the /
        raise DatabaseUnreachable(
            f"database URL {redact(url)!r}: its password holds a character that ends the host part (/, ?, # or @); "
            "percent-encode it (/ as %2F, ? as %3F, # as %23, @ as %40)"
        )
    for port in _ports(parts.netloc.rpartition("@")[2]):
        # empty: the default, as libpq takes it; "²" is a digit to str.isdigit, not to int()
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise DatabaseUnreachable(
                f"database URL {redact(url)!r} has port {port!r}: a port is a number from 1 to 65535; {_EXPECTED}"
            )


def _ports(hosts: str) -> list[str]:
    """The ports written in a URL's host list ("h1:5432,[::1]:5433,h3"), as written."""
    return [m.group(1) for host in hosts.split(",") if (m := re.search(r"(?:^|[^:]|\]):([^:\]]*)$", host))]


def _encode_jsonb(value: Any) -> bytes:
    # Pre-encoded JSON (bytes) passes through; everything else goes via orjson.
    if type(value) is bytes or isinstance(value, bytearray | memoryview):
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


def json_value(text: str | bytes) -> Any:
    """JSON text as Python objects, as pgferry's connections decode jsonb (RawJSON for what orjson
    cannot decode)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return RawJSON(text if isinstance(text, str) else bytes(text).decode())


def _decode_jsonb(data: bytes) -> Any:
    return json_value(data[1:])


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
    elif (setting := _unknown_url_setting(url, exc)) is not None:
        reason = (
            f"?{setting}= in the URL is not a connection parameter pgferry's driver (asyncpg) knows, so it went "
            f"to PostgreSQL as a setting, and PostgreSQL has none of that name either; remove it from the URL"
            + (f" (pgferry waits {CONNECT_TIMEOUT_S:.0f} s for a connection)" if setting == "connect_timeout" else "")
        )
    elif "unsupported startup parameter" in str(exc):  # PgBouncer's words
        reason = (
            f"{exc}: a connection pooler (PgBouncer?) is in the way, and pgferry's relay, streams API, operator "
            "commands and Python API need a direct connection to PostgreSQL (docs/operations.md, Connecting); "
            "writers behind a pooler call ferry.publish in SQL"
        )
    else:
        reason = str(exc) or type(exc).__name__
    return DatabaseUnreachable(
        f"cannot connect to PostgreSQL at {where}: {reason.rstrip('.')}. Check --database-url or {URL_ENV_VAR}."
    )


def _unknown_url_setting(url: str, exc: BaseException) -> str | None:
    """The URL query parameter PostgreSQL refused as an unknown setting, if that is ``exc``: asyncpg
    sends a parameter it does not know (libpq's connect_timeout, keepalives, ...) as a server setting,
    and the bare "unrecognized configuration parameter" did not say it came from the URL."""
    if getattr(exc, "sqlstate", None) != "42704":
        return None
    named = re.search(r'unrecognized configuration parameter "([^"]+)"', str(exc))
    if named is None or named.group(1) not in parse_qs(urlsplit(url).query):
        return None
    return named.group(1)


#: Settings every pgferry session starts with (a caller's own win). JIT off: pgferry's
#: statements are short, but the planner's estimates for its small, rarely analyzed
#: tables (ferry.partitions has 3 rows; never analyzed it is guessed at 860) pass
#: jit_above_cost, and compiling them took 1.2 s of CPU per ``ferry.housekeeping()``
#: call and ~70 ms per ``ferry._tick()``: half the database's work while a relay drained
#: a backlog (docs/benchmarks.md, "JIT").
SESSION_DEFAULTS: Mapping[str, str] = {"jit": "off"}

#: For the sessions of log readers (the stream hub, the streams API, ``read_stream``,
#: ``Ferry.read``), whose statements read the log by its txid index and are prepared once:
#: PostgreSQL may keep a generic plan made while the partitions were empty, and after a
#: partition was analyzed empty (a fresh install, `vacuum analyze` on a quiet database)
#: that plan scans every partition whole (tests/log/test_read_plans.py). One such plan read
#: the transactions in progress at a tick filtered by 1,000 stream names: the hub's read
#: took 100 ms a tick and SSE p50 was 270 ms instead of 10 ms for as long as the
#: connection lived (`pgferry bench streams --only publish`, the first run on a fresh
#: database). ``plan_cache_mode = force_custom_plan`` cured it too, but planning the
#: 1,000-name array each time cost 9-11 ms a read against 0.6 ms.
LOG_READER_SETTINGS: Mapping[str, str] = {"enable_seqscan": "off"}

#: The relay's delivery pool: its statements are planned for each call, with its values and the
#: tables' sizes now. The tables they read swing between empty and large: ferry.retries holds
#: nothing until an endpoint fails, then every event parked for it. A retry read prepared while
#: ferry.retries was empty kept that plan, a sequential scan, for as long as the connection
#: lived: 55 ms a read once an outage had parked 300,000 events (0.4 ms planned per call), for
#: each of 1,000 subscriptions' retry loops, just when they all retry. Planning these statements
#: costs ~0.2 ms; the relay's hot read, ferry.webhook_steps, keeps generic plans by its own setting.
#: DateStyle ISO: the hot read returns its events' created_at as text, which the relay parses.
DELIVERY_SETTINGS: Mapping[str, str] = {
    "synchronous_commit": "off",
    "plan_cache_mode": "force_custom_plan",
    "DateStyle": "ISO",
}


#: The sessions pgferry runs its services on (the relay's, the streams API's, the dashboard's,
#: ``tail``'s: those that name themselves ``pgferry ...``) run PostgreSQL's functions, never a
#: user's:
#: - ``search_path``: with ``public`` on the path, a role that may create functions there (every
#:   role, before PostgreSQL 15) made ``public.format(text, text, text)``, which matches a call
#:   better than ``pg_catalog.format(text, variadic "any")``; the relay ran it as its own role and
#:   it read every subscription's signing secret (outside probe). A database's search_path with a
#:   schema before pg_catalog stopped ticks and rewrote captured payloads the same way.
#: - ``default_transaction_isolation``: a database set to ``serializable`` made the ticker and WAL
#:   capture fail serialization ~30 times a minute and step down each time (outside probe); their
#:   statements are written for read committed.
#: - ``statement_timeout`` and ``lock_timeout``: the relay gives its statements deadlines of its own
#:   (``command_timeout``, ``Liveness``) and waits on its own locks on purpose. A database's
#:   statement_timeout of 50 ms cancelled a worker's read of a 20,000-event transaction again at every
#:   try, and the subscription stalled for good with status showing nothing but lag; a lock_timeout
#:   of 10 ms made the ticker step down ~9 times in 20 s, p99 1.9 s instead of 0.1 s (outside probe).
SERVICE_SETTINGS: Mapping[str, str] = {
    "search_path": "pg_catalog, pg_temp",
    "default_transaction_isolation": "read committed",
    "statement_timeout": "0",
    "lock_timeout": "0",
}


#: What to do where a session cannot write (``writable_here``; SQLSTATE 25006), by why.
READ_ONLY_FIX: Mapping[str, str] = {
    "standby": "this server is a standby (in recovery), where nothing can be written: point pgferry at the primary",
    "read_only": "sessions here are read-only (default_transaction_read_only is on for this role or database), "
    "and pgferry writes: `alter role ... set default_transaction_read_only = off`, or use another role",
}


def _session_settings(server_settings: Mapping[str, str] | None) -> dict[str, str]:
    settings = {**SESSION_DEFAULTS, **(server_settings or {})}
    if settings.get("application_name", "").startswith("pgferry "):
        settings = {**SERVICE_SETTINGS, **settings}
    return settings


async def connect(url: str, *, server_settings: Mapping[str, str] | None = None, **kwargs: Any) -> asyncpg.Connection:
    """Open one connection, or raise DatabaseUnreachable saying why not."""
    check_url(url)
    try:
        conn = await asyncpg.connect(
            url, timeout=CONNECT_TIMEOUT_S, server_settings=_session_settings(server_settings), **kwargs
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        raise _explain(url, exc) from exc
    await init_connection(conn)
    return conn


#: Seconds ``connect_when_up`` waits for a server that says it is starting up or recovering.
STARTING_WAIT_S = 60.0


async def connect_when_up(url: str, *, wait: float = STARTING_WAIT_S, **kwargs: Any) -> asyncpg.Connection:
    """``connect``, waiting up to ``wait`` seconds while the server answers that it is starting up,
    shutting down or not yet consistent (57P03): a relay started with its database, after a crash
    or a restart, exited at once with a hint to check its URL (outside probe)."""
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            return await connect(url, **kwargs)
        except DatabaseUnreachable as exc:
            if not isinstance(exc.__cause__, asyncpg.CannotConnectNowError) or time.monotonic() >= deadline:
                raise
            if not said:
                _log.info("PostgreSQL at %s is not accepting connections yet (%s); waiting up to %.0f s",
                          redact(url), one_line(exc.__cause__), wait)  # fmt: skip
                said = True
            await asyncio.sleep(0.5)


#: What PostgreSQL rolls back whole and a second try may pass: a deadlock's victim, a serialization
#: failure. The relay's own statements take row locks in their own order; an operator's
#: transaction (`pgferry apply`, even --dry-run) taking them in another made one of each pair fail
#: (outside probe).
ROLLED_BACK = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
#: Tries of such a statement or transaction.
ROLLED_BACK_TRIES = 5

_T = TypeVar("_T")
_log = logging.getLogger(__name__)


async def again_if_rolled_back(
    action: Callable[[], Awaitable[_T]],
    what: str,
    *,
    also: tuple[type[asyncpg.PostgresError], ...] = (),
    tries: int = ROLLED_BACK_TRIES,
) -> _T:
    """``action()``, again (after a short random pause) while PostgreSQL rolls it back as
    ROLLED_BACK (or ``also``), up to ``tries`` tries; the last one's error is raised. Only for an
    action that did nothing when it failed: one statement, or one transaction opened inside it."""
    tried = 0
    while True:
        tried += 1
        try:
            return await action()
        except (*ROLLED_BACK, *also) as exc:
            if tried == tries:
                raise
            _log.info("%s rolled back (%s); trying again", what, one_line(exc))
            await asyncio.sleep(random.uniform(0.01, 0.05) * tried)


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
    server_settings: Mapping[str, str] | None = None,
    reset: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    command_timeout: float | None = None,
) -> asyncpg.Pool:
    """Open a connection pool, or raise DatabaseUnreachable saying why not.

    ``reset``: what releasing a connection runs instead of asyncpg's reset
    round trip (``rollback_if_open`` for a caller that never leaves session
    state on pooled connections)."""
    check_url(url)
    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_S,
            init=init_connection,
            server_settings=_session_settings(server_settings),
            reset=reset,
            command_timeout=command_timeout,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        raise _explain(url, exc) from exc
    assert pool is not None
    return pool


def url_from_env() -> str | None:
    return os.environ.get(URL_ENV_VAR) or None
