"""Plain-text tables and latency statistics for the benchmark's output."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Latency:
    """Percentiles of a set of latencies, in milliseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latency:
        ordered = sorted(samples_ms)
        if not ordered:
            nan = math.nan
            return cls(0, nan, nan, nan, nan)
        return cls(
            len(ordered),
            percentile(ordered, 50),
            percentile(ordered, 90),
            percentile(ordered, 99),
            ordered[-1],
        )


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (what pgbench-style reports use)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def num(value: float | None, digits: int = 0) -> str:
    """A number with thousands separators; '-' when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def ms(value: float) -> str:
    """Milliseconds with as many decimals as are meaningful at that size."""
    if math.isnan(value):
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def pct(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.1f}%"


def _numeric(cell: str) -> bool:
    stripped = cell.replace(",", "").replace(".", "").replace("%", "").rstrip("x").lstrip("-<>= ")
    return stripped.isdigit() or cell == "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; text left-aligned, numeric columns right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    right = [bool(rows) and all(_numeric(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
