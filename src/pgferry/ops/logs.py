"""Log output: human-readable lines by default, JSON lines on request, never a secret.

Secrets can reach a log line in ways no call site foresees (an exception
that quotes a URL, a driver error echoing a parameter), so redaction is done
on the finished text of every record, message and traceback alike, rather
than trusted to each ``log.*`` call: signing secrets (``whsec_...``),
passwords in URLs, bearer/basic credentials and ``password=`` settings.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from pgferry.delivery.signing import redact_secrets

_REDACTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@"), r"\1***@"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    (re.compile(r"(?i)\b(password|passwd|secret|token)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"), r"\1\2***"),
]

FORMATS = ("human", "json")


def redact(text: str) -> str:
    """The text with every recognisable secret replaced by ***."""
    text = redact_secrets(text)
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


class HumanFormatter(logging.Formatter):
    def __init__(self, process: str | None = None) -> None:
        tag = f"[process {process}] " if process is not None else ""
        super().__init__(f"%(asctime)s %(levelname)-7s {tag}%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, pid, process (the slot of a
    `pgferry run --processes N` child) and exc when there is one."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            "pid": record.process,
        }
        if self.process is not None:
            entry["process"] = self.process
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(entry).decode()


class PoolFloorWarnings(logging.Filter):
    """asyncpg's pool logs "Failed to restore the pool connection floor; retrying" with a whole
    traceback at every retry while the database is down: 18 of them in a short outage filled the
    relay's log (outside review), which already says the database is gone. This keeps one line
    with the reason, at most every ``interval`` seconds, saying how many it left out."""

    MESSAGE = "Failed to restore the pool connection floor"

    def __init__(self, interval: float = 30.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = -math.inf
        self.left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.MESSAGE):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self.left_out += 1
            return False
        exc = record.exc_info[1] if record.exc_info else None
        reason = (str(exc) or type(exc).__name__) if exc is not None else "unknown"
        more = f" ({self.left_out} more failures since the last such line)" if self.left_out else ""
        record.msg, record.args = "database pool: cannot reconnect (%s); retrying%s", (reason, more)
        record.exc_info, record.exc_text = None, None
        self._last, self.left_out = now, 0
        return True


def configure(*, verbose: bool = False, fmt: str = "human", process: str | None = None) -> None:
    """(Re)configure the root logger: pgferry's commands call this once their options are known.

    ``process``: the slot of a child of `pgferry run --processes N`, shown on each line, since
    the children share the supervisor's stderr."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else HumanFormatter(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    pool = logging.getLogger("asyncpg.pool")
    for stale in [f for f in pool.filters if isinstance(f, PoolFloorWarnings)]:
        pool.removeFilter(stale)
    pool.addFilter(PoolFloorWarnings())
