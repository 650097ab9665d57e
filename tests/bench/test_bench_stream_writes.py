"""`pgferry bench stream-writes` runs end to end at a tiny scale (full-size numbers in docs/benchmarks.md)."""

from __future__ import annotations

from pgferry.embedded import EmbeddedPostgres
from tests.helpers import cli


async def test_stream_writes_bench_prints_every_variant_and_the_read_costs(
    pg: EmbeddedPostgres, pgferry_cmd: list[str]
) -> None:
    result = await cli(
        pgferry_cmd, pg.url, "bench", "stream-writes", "--database-url", pg.url, "--seconds", "1", "--rounds", "1",
        "--closed", "100", "--log-events", "3000", "--log-streams", "100", timeout=120,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    for write in ("publish ", "publish_many(100)"):
        for variant in ("before", "current", "+index"):
            assert any(line.startswith(write) and f" {variant} " in line for line in out.splitlines()), (write, out)
    for how in ("scan the retained log", "stream catalog (new stream)", "index on (stream, txid)"):
        assert how in out, out
    assert "ERRORS" not in result.stderr, result.stderr
