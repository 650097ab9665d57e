"""SQL shipped with pgferry: versioned migrations, function files and named queries.

SQL lives in ``.sql`` files next to this module so it can be read, reviewed and
run by hand; Python only looks statements up by name.

The layout follows Skytools PgQ: ``migrations/NNNN_*.sql`` hold what must be
versioned (tables, indexes, partitions, data moves, grants on tables, drops
of functions that went away), applied once each; ``functions/<schema>.<name>.sql``
hold the current definition of every function, trigger function and the
triggers that use them, each file written with ``create or replace`` and
applied on every install after the migrations, so the file is the contract.
An add-on (``addons/<name>/``) has both, applied after the core's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

_NAME_MARKER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


_DEFINES = re.compile(r"^create\s+or\s+replace\s+function\s+(\w+\.\w+)\s*\(", re.IGNORECASE | re.MULTILINE)
_CALLS = re.compile(r"\b((?:ferry|net|supabase_functions)\.\w+)\s*\(")
_COMMENT = re.compile(r"--[^\n]*")
_STRING = re.compile(r"'(?:[^']|'')*'")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def empty(self) -> bool:
        """Only comments left (its functions moved to files): nothing to execute."""
        return not _COMMENT.sub("", self.sql).strip()


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


@dataclass(frozen=True)
class FunctionFile:
    """One file of ``functions/``: the functions it defines and the pgferry functions it calls."""

    name: str  # e.g. "ferry.batch_events"
    sql: str
    defines: frozenset[str]
    calls: frozenset[str]


@cache
def functions(addon: str | None = None) -> tuple[FunctionFile, ...]:
    """The function files of the core schema (or of an add-on), each after the files whose
    functions it calls (a SQL-language body is checked against them when it is created);
    by name otherwise."""
    return read_functions(
        resources.files(__package__).joinpath("functions" if addon is None else f"addons/{addon}/functions")
    )


def read_functions(folder: Traversable) -> tuple[FunctionFile, ...]:
    """The function files in ``folder`` in the order ``functions`` applies them (none if there is
    no such folder); the upgrade tests read a released version's files with it."""
    if not folder.is_dir():
        return ()
    files: dict[str, FunctionFile] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        defines = frozenset(_DEFINES.findall(text))
        name = entry.name.removesuffix(".sql")
        if defines != {name}:
            raise ValueError(f"{entry.name} must define {name} and nothing else; it defines {sorted(defines)}")
        code = _STRING.sub("''", _COMMENT.sub("", text))  # a message naming a function is not a call
        calls = frozenset(_CALLS.findall(code)) - defines
        files[name] = FunctionFile(name, text, defines, calls)
    ordered: list[FunctionFile] = []
    placed: set[str] = set()
    pending = dict(sorted(files.items()))
    while pending:
        ready = [f for f in pending.values() if not (f.calls & pending.keys())]
        if not ready:
            raise ValueError(f"function files call each other in a circle: {sorted(pending)}")
        for f in ready:
            ordered.append(f)
            placed.add(f.name)
            del pending[f.name]
    return tuple(ordered)


ADDONS = ("pg_net",)


def latest_version() -> int:
    return migrations()[-1].version
