"""A relay serving the API raises its open files limit to the hard limit (each reader is a
socket; a soft limit of 1,024 refused the 1,025th client with EMFILE), and serves no more readers
than the limit leaves room for, saying so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.helpers import api_relay_process


def open_files_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def prlimit(soft: int, hard: int) -> list[str]:
    """Runs the relay under an open files limit of ``soft``:``hard``."""
    return ["prlimit", f"--nofile={soft}:{hard}"]


async def test_a_relay_serving_the_api_raises_its_open_files_limit_and_caps_its_readers_to_it(
    pgferry_cmd: list[str], db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "raised.log"
    async with api_relay_process(pgferry_cmd, db_url, log=log, wrapper=prlimit(1024, 8192)) as (relay, _):
        assert open_files_limit(relay.pid) == (8192, 8192)
    text = await asyncio.to_thread(log.read_text)
    assert "open files limit raised from 1024 to 8192" in text, text
    assert "serving 7936 readers at most, not 20000: this process may open 8192 files" in text, text

    # A hard limit of 300: 44 readers, and the next one is told to come back.
    log = tmp_path / "capped.log"
    async with (
        api_relay_process(pgferry_cmd, db_url, log=log, wrapper=prlimit(300, 300)) as (_, base),
        aiohttp.ClientSession() as session,
    ):
        readers = [await session.get(f"{base}/s") for _ in range(44)]
        try:
            assert all(r.status == 200 for r in readers)
            async with session.get(f"{base}/s/events") as r:
                assert r.status == 503 and "44 readers at most" in (await r.json())["error"]
        finally:
            for r in readers:
                r.close()
        await asyncio.sleep(0.2)
        async with session.get(f"{base}/s/events") as r:
            assert r.status == 200  # they left: room again
    assert "serving 44 readers at most, not 20000" in await asyncio.to_thread(log.read_text)
