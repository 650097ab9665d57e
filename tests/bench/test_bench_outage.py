"""`pgferry bench outage` runs end to end at a tiny scale (its full-size numbers are in docs/reliability.md)."""

from __future__ import annotations

import re

from pgferry.embedded import EmbeddedPostgres
from tests.helpers import cli


async def test_outage_bench_delivers_the_whole_backlog_within_seconds_of_the_first_successful_probe(
    pg: EmbeddedPostgres, pgferry_cmd: list[str]
) -> None:
    result = await cli(
        pgferry_cmd, pg.url, "bench", "outage", "--database-url", pg.url, "--events", "300", "--down", "3", timeout=60
    )
    out = result.stdout
    # Exit 1 says a target was missed. In a 3 s outage the requests/s goal is decided by the burst
    # before the endpoint counts as down (20 connects in the first second on a loaded CI run): a
    # speed target, measured at full size (docs/reliability.md), not asserted here. The rest is.
    missed = [line for line in out.splitlines() if "MISSED" in line]
    assert all(line.startswith("requests to the endpoint while down") for line in missed), missed
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, out[-3000:] + result.stderr[-3000:]
    assert "events: committed 300, delivered 300, duplicates 0, dead 0 (must be 0), lost 0 (must be 0)" in out, out
    drain = re.search(r"\(the drain\): ([\d.]+) s", out)
    assert drain is not None and float(drain.group(1)) < 10, out
    down = re.search(r"requests to the endpoint while down: (\d+) in", out)
    assert down is not None and 0 < int(down.group(1)) < 300, out  # counted, and far fewer than one per event
