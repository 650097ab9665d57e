"""The benchmark's SQL, kept in ``bench/sql/*.sql`` like the rest of pgferry's SQL."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME_MARKER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def read(name: str) -> str:
    """The text of ``bench/sql/<name>``."""
    return resources.files(__package__).joinpath("sql", name).read_text(encoding="utf-8")


@cache
def _named_queries(file: str) -> dict[str, str]:
    parts = _NAME_MARKER.split(read(file))
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def named(file: str, name: str) -> str:
    """The query marked ``-- name: NAME`` in ``bench/sql/<file>``."""
    try:
        return _named_queries(file)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in pgferry/bench/sql/{file}") from None


def query(name: str) -> str:
    """The named query from ``bench/sql/queries.sql``."""
    return named("queries.sql", name)


def pgbench_script(name: str, **values: str) -> str:
    """A pgbench script with its ``{placeholders}`` filled in (plain replace: SQL is full of braces)."""
    text = read(f"pgbench_{name}.sql")
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text
