"""Bearer tokens of the streams HTTP API: making them, the stream patterns they carry, and
``TokenStore``, which the relay asks whether a request may read or write a stream.

A token is ``pft_`` and 32 random bytes in URL-safe base64, made here and shown once;
``ferry.api_tokens`` keeps only its SHA-256 (migration 0009 says why a fast hash is right
for 256 random bits). Each token has read and write patterns over stream names: ``*`` is
any run of characters (``:`` and ``.`` included), ``?`` one character, everything else is
literal and case-sensitive; ``*`` alone is every stream.

The store keeps the live tokens in memory, keyed by hash, and reloads them (one query)
when they are older than ``refresh_interval``, so a revoked token stops working within
that time, and when a well-formed token is not found, so a new one works at once. Reloads
on a miss start at most once per ``miss_refresh_gap``: a flood of made-up tokens costs one
query a second, whatever its rate, and each such request waits for it (a tarpit). Only the
live tokens are held: nothing is kept per token presented.

Imports nothing of pgferry but ``db``, ``sql`` and ``errors``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import asyncpg

from pgferry import sql
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import InvalidTokenPattern, PermissionDenied, PgferryError, TokenStoreUnavailable

log = logging.getLogger(__name__)

PREFIX = "pft_"
#: 256 bits: guessing is hopeless, so a fast hash suffices (migration 0009).
TOKEN_BYTES = 32
#: the exact shape new_token makes: anything else is refused without a lookup
_TOKEN = re.compile(r"pft_[A-Za-z0-9_-]{43}")
_BEARER = re.compile(r"bearer +(\S+)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: as ferry._check_token_patterns
MAX_PATTERN_LENGTH = 200
MAX_PATTERNS = 100

Action = Literal["read", "write"]


def new_token() -> str:
    """A fresh API token: ``pft_`` + 32 random bytes, URL-safe base64 (47 characters)."""
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> bytes:
    """What ``ferry.api_tokens.token_hash`` holds for ``token``: its SHA-256 (32 bytes)."""
    return hashlib.sha256(token.encode()).digest()


def bearer_from_header(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive);
    None when the header is missing or another scheme."""
    if authorization is None:
        return None
    match = _BEARER.fullmatch(authorization.strip())
    return match[1] if match else None


# -- patterns ---------------------------------------------------------------


def check_pattern(pattern: str, what: str = "read", position: int = 1) -> None:
    """Raise InvalidTokenPattern unless ``pattern`` is non-blank, at most 200 characters and free
    of control characters (what ferry._check_token_patterns refuses, said with the pattern)."""
    if not pattern.strip():
        raise InvalidTokenPattern(
            f"{what} pattern #{position} is empty; a pattern is a stream name with * for any run of "
            "characters and ? for one (* alone is every stream)"
        )
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidTokenPattern(
            f"{what} pattern #{position} ({pattern[:40]!r}...) is {len(pattern)} characters long; "
            f"the limit is {MAX_PATTERN_LENGTH}"
        )
    if _CONTROL.search(pattern):
        raise InvalidTokenPattern(
            f"{what} pattern #{position} ({pattern!r}) holds a control character (a line break, a tab, ...)"
        )


def check_patterns(patterns: Sequence[str], what: str = "read") -> None:
    if len(patterns) > MAX_PATTERNS:
        raise InvalidTokenPattern(f"a token takes at most {MAX_PATTERNS} {what} patterns, got {len(patterns)}")
    for position, pattern in enumerate(patterns, 1):
        check_pattern(pattern, what, position)


class _Segment:
    """A piece of a pattern between two ``*``: literal characters and ``?``."""

    __slots__ = ("_regex", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._regex = (
            re.compile("".join("." if c == "?" else re.escape(c) for c in text), re.DOTALL) if "?" in text else None
        )

    def at(self, name: str, i: int) -> bool:
        """Does the segment match ``name`` exactly from ``i``?"""
        if self._regex is None:
            return name.startswith(self.text, i)
        return self._regex.match(name, i) is not None

    def find(self, name: str, start: int, end: int) -> int:
        """Where the segment first matches within ``name[start:end]``, or -1."""
        if self._regex is None:
            return name.find(self.text, start, end)
        found = self._regex.search(name, start, end)
        return -1 if found is None else found.start()


class Pattern:
    """A compiled stream pattern. Matching takes time linear in the stream name (per segment):
    the first and last segments are anchored, and each one between takes its leftmost place,
    which is never worse than a later one. No regex over the whole pattern, so no pattern an
    operator writes can make a hostile stream name backtrack."""

    __slots__ = ("_first", "_last", "_middle", "_min_length", "_star", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts = text.split("*")
        self._star = len(parts) > 1
        self._first = _Segment(parts[0])
        self._last = _Segment(parts[-1]) if self._star else self._first
        self._middle = tuple(_Segment(p) for p in parts[1:-1] if p)
        self._min_length = len(text) - text.count("*")

    def matches(self, stream: str) -> bool:
        if not self._star:
            return len(stream) == len(self.text) and self._first.at(stream, 0)
        if len(stream) < self._min_length:
            return False
        end = len(stream) - len(self._last.text)
        if not (self._first.at(stream, 0) and self._last.at(stream, end)):
            return False
        position = len(self._first.text)
        for segment in self._middle:
            found = segment.find(stream, position, end)
            if found < 0:
                return False
            position = found + len(segment.text)
        return True

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"


def matches(pattern: str, stream: str) -> bool:
    """Does ``stream`` match ``pattern``? (``*`` any run, ``?`` one character, the rest literal.)"""
    return Pattern(pattern).matches(stream)


class PatternSet:
    """A token's read or write patterns: a stream is in the set when any pattern matches it."""

    __slots__ = ("_everything", "_exact", "_patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        texts = list(dict.fromkeys(patterns))
        self._everything = "*" in texts
        self._exact = frozenset(t for t in texts if "*" not in t and "?" not in t)
        self._patterns = tuple(Pattern(t) for t in texts if t not in self._exact)

    def __contains__(self, stream: str) -> bool:
        return self._everything or stream in self._exact or any(p.matches(stream) for p in self._patterns)


# -- authorizing requests ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """What to answer a request: ``status`` 200 (go ahead), 401 or 403, and ``reason``, a short
    text fit for the response body. A 401 never says whether the token was missing,
    malformed, unknown or revoked."""

    status: Literal[200, 401, 403]
    reason: str
    #: the token's name (for access logs), None on a 401
    token_name: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200

    @property
    def challenge(self) -> str | None:
        """The ``WWW-Authenticate`` header value to send with a 401 or 403 (RFC 6750)."""
        if self.status == 401:
            return 'Bearer realm="pgferry"'
        if self.status == 403:
            return 'Bearer realm="pgferry", error="insufficient_scope"'
        return None


UNAUTHORIZED = Decision(401, "a valid API token is required (Authorization: Bearer pft_...)")


class Database(Protocol):
    """What the store needs of an asyncpg pool (or connection)."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class TokenStoreSettings:
    #: seconds a loaded set of tokens is trusted: a revoked token is refused within this time
    refresh_interval: float = 5.0
    #: least seconds between two loads; a token not found waits for the next one (at most this long)
    miss_refresh_gap: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.miss_refresh_gap <= self.refresh_interval:
            raise PgferryError(
                "API tokens: need 0 < miss_refresh_gap <= refresh_interval, got "
                f"{self.miss_refresh_gap} and {self.refresh_interval}"
            )


@dataclass(frozen=True, slots=True)
class _Token:
    id: int
    name: str
    hash: bytes
    read: PatternSet
    write: PatternSet
    #: its last use was noted more than a minute ago (or never): note the next one
    touch_due: bool


class TokenStore:
    """The live API tokens, for the relay's HTTP API. ``await store.authorize(token, stream, action)``
    for each request; ``await store.refresh()`` once at startup to fail early (optional)."""

    def __init__(self, db: Database, settings: TokenStoreSettings | None = None) -> None:
        self._db = db
        self.settings = settings or TokenStoreSettings()
        self._tokens: dict[bytes, _Token] = {}
        self._fresh_at = -math.inf  # when the last successful load started (time.monotonic)
        self._tried_at = -math.inf  # when the last load started, successful or not
        self._loading: asyncio.Task[None] | None = None
        self._used: set[int] = set()  # ids of tokens used whose use is to be noted on the next load
        #: successful loads so far
        self.loads = 0

    async def authorize(self, bearer: str | None, stream: str, action: Action) -> Decision:
        """May the holder of ``bearer`` (the token itself, see ``bearer_from_header``) ``action``
        the stream ``stream``? May wait for a load of the tokens (a query; at most
        ``miss_refresh_gap`` plus the query for a token not found). Raises TokenStoreUnavailable
        when the tokens are due for a reload and it fails (answer 503)."""
        if action not in ("read", "write"):
            raise ValueError(f"action must be 'read' or 'write', got {action!r}")
        if bearer is None or not _TOKEN.fullmatch(bearer):
            return UNAUTHORIZED  # malformed: no lookup, no query
        digest = hash_token(bearer)
        now = time.monotonic()
        await self._fresh_since(now - self.settings.refresh_interval)  # at once unless they are due
        token = self._find(digest)
        if token is None:
            await self._fresh_since(now)  # it may have been made since the last load
            token = self._find(digest)
            if token is None:
                return UNAUTHORIZED
        if stream not in (token.read if action == "read" else token.write):
            verb = "read" if action == "read" else "publish to"
            return Decision(403, f"this API token may not {verb} this stream", token.name)
        if token.touch_due:
            self._used.add(token.id)
        return Decision(200, "ok", token.name)

    async def refresh(self) -> int:
        """Load the tokens now; return how many are live. Raises TokenStoreUnavailable."""
        await self._fresh_since(time.monotonic(), gap=0.0)
        return len(self._tokens)

    def _find(self, digest: bytes) -> _Token | None:
        # The dict finds a candidate by the hash of the presented token (timing there can only
        # tell about a SHA-256 nobody can invert); the comparison that decides is constant-time.
        token = self._tokens.get(digest)
        if token is None or not hmac.compare_digest(token.hash, digest):
            return None
        return token

    async def _fresh_since(self, since: float, gap: float | None = None) -> None:
        """Return once a load that started at or after ``since`` has succeeded. Joins the load under
        way, or starts one, never sooner than ``gap`` (miss_refresh_gap) after the previous start."""
        gap = self.settings.miss_refresh_gap if gap is None else gap
        called = time.monotonic()
        while self._fresh_at < since:
            loading = self._loading
            if loading is not None and not loading.done():
                await asyncio.shield(loading)  # a request given up on does not cancel the load
                continue
            if loading is not None and self._tried_at >= called and (failure := loading.exception()) is not None:
                # A load that began while this request waited has failed: that was its attempt (the
                # requests of a flood share one), even if it woke only after the load had ended.
                raise failure
            wait = self._tried_at + gap - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._tried_at = time.monotonic()
            self._loading = asyncio.get_running_loop().create_task(self._load(self._tried_at))
            self._loading.add_done_callback(_retrieve)

    async def _load(self, started: float) -> None:
        used = list(self._used)
        try:
            rows = await self._db.fetch(sql.query("api_token_load"), used)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            log.warning("cannot load the API tokens: %s", exc)
            raise TokenStoreUnavailable(f"cannot load the API tokens: {exc}") from exc
        self._tokens = {
            bytes(r["token_hash"]): _Token(
                r["id"], r["name"], bytes(r["token_hash"]), PatternSet(r["read_patterns"]),
                PatternSet(r["write_patterns"]), r["touch_due"],
            )
            for r in rows
        }  # fmt: skip
        self._used.difference_update(used)
        self._fresh_at = started
        self.loads += 1
        log.debug("loaded %d live API token(s)", len(self._tokens))


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a load's failure as seen when every request waiting for it has gone."""
    if not task.cancelled():
        task.exception()


# -- managing tokens (`pgferry token ...`) ---------------------------------------


async def create(conn: asyncpg.Connection, name: str, read: Sequence[str], write: Sequence[str]) -> str:
    """Store a new token allowed ``read`` and ``write`` patterns; return the token (its only copy)."""
    check_patterns(read, "read")
    check_patterns(write, "write")
    token = new_token()
    await _admin(conn, "fetchval", "api_token_create", name, hash_token(token), list(read), list(write))
    return token


async def revoke(conn: asyncpg.Connection, name: str) -> None:
    await _admin(conn, "execute", "api_token_revoke", name)


async def list_tokens(conn: asyncpg.Connection, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Every live token (or every token) with its patterns and dates; never a hash."""
    return [dict(r) for r in await _admin(conn, "fetch", "api_token_list", include_revoked)]


async def _admin(conn: asyncpg.Connection, method: str, query: str, *args: Any) -> Any:
    try:
        return await getattr(conn, method)(sql.query(query), *args)
    except asyncpg.InsufficientPrivilegeError as exc:
        if query == "api_token_list":  # ferry_relay may list them
            raise PermissionDenied(f"{exc.message}: listing API tokens takes ferry_relay", exc) from None
        raise PgferryError(
            f"{exc.message}: creating and revoking API tokens takes the role that installed pgferry "
            "(ferry_relay may only read them), or one it granted INSERT and UPDATE on ferry.api_tokens"
        ) from None
    except asyncpg.PostgresError as exc:
        if exc.sqlstate in ("22023", "23505", "42704"):
            hint = getattr(exc, "hint", None)
            raise PgferryError(f"{exc.message}. {hint}" if hint else exc.message) from None
        raise
