"""A relay serving the API raises its open files limit to the hard limit (each reader is a
socket; a soft limit of 1,024 refused the 1,025th client with EMFILE), and serves no more readers
than the limit leaves room for, saying so."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp

from tests.helpers import eventually, pgferry_env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def open_files_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


async def run_relay(
    pgferry_cmd: list[str], db_url: str, log: Path, soft: int, hard: int
) -> tuple[asyncio.subprocess.Process, str]:
    """`pgferry run --api-port` under an open files limit of ``soft``:``hard`` (prlimit), once it serves."""
    port = free_port()
    with log.open("wb") as out:
        relay = await asyncio.create_subprocess_exec(
            "prlimit", f"--nofile={soft}:{hard}", *pgferry_cmd, "run", "--database-url", db_url,
            "--api-port", str(port), "--api-allow-loopback", stdout=out, stderr=out, env=pgferry_env(db_url),
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1/streams"

    async def serving() -> bool:
        assert relay.returncode is None, "the relay exited"
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{base}/probe/events") as r:
                return r.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await eventually(serving, timeout=20, what="the relay's streams API")
    return relay, base


async def stop(relay: asyncio.subprocess.Process) -> None:
    relay.terminate()
    try:
        await asyncio.wait_for(relay.wait(), 20)
    except TimeoutError:
        relay.kill()
        await relay.wait()


async def test_a_relay_serving_the_api_raises_its_open_files_limit_and_caps_its_readers_to_it(
    pgferry_cmd: list[str], db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "raised.log"
    relay, _ = await run_relay(pgferry_cmd, db_url, log, soft=1024, hard=8192)
    try:
        assert open_files_limit(relay.pid) == (8192, 8192)
    finally:
        await stop(relay)
    text = await asyncio.to_thread(log.read_text)
    assert "open files limit raised from 1024 to 8192" in text, text
    assert "serving 7936 readers at most, not 20000: this process may open 8192 files" in text, text

    # A hard limit of 300: 44 readers, and the next one is told to come back.
    log = tmp_path / "capped.log"
    relay, base = await run_relay(pgferry_cmd, db_url, log, soft=300, hard=300)
    try:
        async with aiohttp.ClientSession() as session:
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
    finally:
        await stop(relay)
    assert "serving 44 readers at most, not 20000" in await asyncio.to_thread(log.read_text)
