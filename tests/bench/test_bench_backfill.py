"""`pgferry bench backfill` runs end to end at a tiny scale (full-size numbers in docs/backfills.md)."""

from __future__ import annotations

from pgferry.embedded import EmbeddedPostgres
from tests.helpers import cli


async def test_backfill_bench_prints_the_three_cells_and_checks_every_row_became_one_read(
    pg: EmbeddedPostgres, pgferry_cmd: list[str]
) -> None:
    result = await cli(
        pgferry_cmd, pg.url, "bench", "backfill", "--database-url", pg.url, "--rows", "20000", "--chunk", "2000",
        "--clients", "2", "--seconds", "1", timeout=180,
    )  # fmt: skip
    out = result.stdout
    # The speed targets are not for a 20,000-row table on a busy test machine: exit 1 is allowed.
    assert result.returncode in (0, 1), out[-3000:] + result.stderr[-3000:]
    for cell in ("writers alone, first", "backfill alone", "side by side", "writers alone, last"):
        assert any(line.startswith(cell) for line in out.splitlines()), out
    line = next(ln for ln in out.splitlines() if ln.startswith("every row one READ event"))
    assert line.split()[-1] == "met" and "40,000" in line, out
