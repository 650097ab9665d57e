"""SQL shipped with pgferry: versioned migrations and named queries.

SQL lives in ``.sql`` files next to this module so it can be read, reviewed and
run by hand; Python only looks statements up by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME_MARKER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def _queries() -> dict[str, str]:
    text = _read("queries.sql")
    parts = _NAME_MARKER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    """Return the named query from ``queries.sql``."""
    try:
        return _queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in pgferry/sql/queries.sql") from None


@cache
def migrations(addon: str | None = None) -> tuple[Migration, ...]:
    """All migrations of the core schema (or of an add-on such as ``pg_net``), in version order."""
    folder = resources.files(__package__).joinpath("migrations" if addon is None else f"addons/{addon}")
    if not folder.is_dir():
        raise KeyError(f"no add-on named {addon!r}")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    return tuple(found)


ADDONS = ("pg_net",)


def latest_version() -> int:
    return migrations()[-1].version
