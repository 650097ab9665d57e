"""`--pin APP:FERRY` (bench/cores.py): what it refuses, and whom it puts where."""

from __future__ import annotations

import asyncio
import os

import asyncpg
import click
import pytest

from pgferry.bench.cores import PIN_EVERY_S, CoreSplit, parse_split, pinned
from pgferry.embedded import EmbeddedPostgres

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("text", "says"),
    [("0", "APP:FERRY"), ("a:b", "APP:FERRY"), ("0:0", "share CPU 0"), ("0:4096", "not available here")],
)
def test_a_bad_split_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(click.BadParameter, match=says):
        parse_split(text)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to split")
async def test_pgbench_backends_go_to_the_application_side_and_everything_else_to_pgferrys(
    pg: EmbeddedPostgres,
) -> None:
    split = parse_split(f"{CPUS[0]}:{CPUS[1]}")
    assert split == CoreSplit(frozenset({CPUS[0]}), frozenset({CPUS[1]}))
    before = os.sched_getaffinity(0)
    app = await asyncpg.connect(pg.url, server_settings={"application_name": "pgbench"})
    other = await asyncpg.connect(pg.url)
    try:
        app_pid, other_pid = app.get_server_pid(), other.get_server_pid()
        async with pinned(split, pg.url):
            await asyncio.sleep(5 * PIN_EVERY_S)
            assert os.sched_getaffinity(app_pid) == split.app
            assert os.sched_getaffinity(other_pid) == split.ferry
            assert os.sched_getaffinity(0) == split.ferry
        assert os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(app_pid) == os.sched_getaffinity(other_pid) == before
    finally:
        await app.close()
        await other.close()
