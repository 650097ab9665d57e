"""`pgferry run --processes N`: a supervisor and N relay processes, as real processes, SIGKILLs included."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from pgferry.embedded import free_port
from pgferry.receiver import Receiver
from pgferry.relay.process import RelaySettings
from pgferry.relay.supervisor import GaveUp, Supervisor, SupervisorSettings, usable_cores
from tests.helpers import MakeReceiver, cli, eventually, received_ids


class Supervised:
    """`pgferry run --processes N` in a subprocess, its log lines (children's included) collected."""

    def __init__(self, cmd: list[str], url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*cmd, "run", "--database-url", url, *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def logged(self, text: str) -> int:
        return sum(text in line for line in self.lines)


@pytest.fixture
async def supervised(pgferry_cmd: list[str], db_url: str) -> AsyncIterator[list[Supervised]]:
    started: list[Supervised] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait()


async def children(conn: asyncpg.Connection, supervisor_pid: int) -> dict[int, list[str]]:
    """Live relays of this supervisor (their ids read host:pid:SUPERVISOR.SLOT:random): pid -> owned."""
    rows = await conn.fetch(
        "select pid, owned from ferry.relays where id like '%:' || $1 || '.%' "
        "and heartbeat_at > now() - interval '15 seconds'",
        str(supervisor_pid),
    )
    return {r["pid"]: sorted(r["owned"]) for r in rows}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def subscribe_many(conn: asyncpg.Connection, url: str, n: int) -> list[str]:
    names = [f"hook-{i}" for i in range(n)]
    for name in names:
        await conn.execute("select ferry.subscribe($1, array[$1], $2)", name, url)
    return names


async def publish_each(conn: asyncpg.Connection, names: list[str], per: int) -> set[int]:
    rows = await conn.fetch(
        "select ferry.publish(s, jsonb_build_object('n', g)) as id from unnest($1::text[]) s, generate_series(1, $2) g",
        names, per,
    )  # fmt: skip
    return {r["id"] for r in rows}


async def test_two_processes_share_the_subscriptions_serve_one_metrics_port_and_stop_on_sigterm(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, supervised: list[Supervised],
    receiver_factory: MakeReceiver,
) -> None:  # fmt: skip
    receiver, url = await receiver_factory()
    names = await subscribe_many(conn, url, 4)
    port, dashboard, api = free_port(), free_port(), free_port()
    s = Supervised(pgferry_cmd, db_url, "--processes", "2", "--metrics-port", str(port),
                   "--dashboard-port", str(dashboard), "--api-port", str(api))  # fmt: skip
    supervised.append(s)

    async def spread() -> bool:  # fair share: 2 subscriptions each
        return sorted(len(owned) for owned in (await children(conn, s.proc.pid)).values()) == [2, 2]

    await eventually(spread, timeout=30, what="both relay processes to claim their share")
    # Each claimed its share at once (OwnershipSettings.peers): the first to start no longer took
    # all four and handed two back, waiting up to stop_grace for their rounds (outside probe).
    assert s.logged("handing") == 0
    pids = set(await children(conn, s.proc.pid))
    assert s.proc.pid not in pids
    assert s.logged("[process 1]") and s.logged("[process 2]")

    async with aiohttp.ClientSession() as http:

        async def both_scraped() -> bool:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            return 'process="1"' in text and 'process="2"' in text

        await eventually(both_scraped, timeout=15, what="the metrics of both processes on one port")
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        async with http.get(f"http://127.0.0.1:{dashboard}/") as response:
            page = await response.text()
        assert response.status == 200 and all(f":{pid}:{s.proc.pid}." in page for pid in pids)
        for _ in range(4):  # the streams API: the supervisor's socket, answered by the children
            async with http.get(f"http://127.0.0.1:{api}/v1/streams/orders") as response:
                assert response.status == 401
    assert 'pgferry_relay_processes{state="running"} 2.0' in text
    assert sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("pgferry_relay_owned_subscriptions{")) == 4  # fmt: skip

    status = await cli(pgferry_cmd, db_url, "relays", "--json")
    assert status.returncode == 0, status.stderr
    assert all(f"{pid}" in status.stdout for pid in pids) and f":{s.proc.pid}.1:" in status.stdout

    # SIGTERM with deliveries under way: every process stops gracefully, nothing is lost. Sent to
    # every process at once, as systemd's stop does (KillMode=control-group): the children took
    # the supervisor's forward for a second signal and exited without releasing (outside probe).
    ids = await publish_each(conn, names, 200)
    await eventually(lambda: _some(receiver), timeout=10, what="deliveries to begin")
    s.proc.send_signal(signal.SIGTERM)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    assert await asyncio.to_thread(s.proc.wait, 30) == 0
    assert s.logged("exiting now") == 0 and s.logged("the same request") >= 1
    assert s.logged("relay stopped") == 2 and s.logged("every relay process stopped") == 1
    assert not [pid for pid in pids if alive(pid)]
    assert await conn.fetchval("select count(*) from ferry.relays") == 0  # each said goodbye
    rest = Supervised(pgferry_cmd, db_url, "--processes", "1")
    supervised.append(rest)

    async def everything() -> bool:
        return ids <= set(received_ids(receiver))

    await eventually(everything, timeout=30, what="every event published before the SIGTERM")


async def _some(receiver: Receiver) -> bool:
    return len(receiver.received) > 0


async def test_a_killed_process_is_restarted_and_the_set_dies_with_a_killed_supervisor(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, supervised: list[Supervised],
    receiver_factory: MakeReceiver,
) -> None:  # fmt: skip
    receiver, url = await receiver_factory()
    names = await subscribe_many(conn, url, 4)
    s = Supervised(pgferry_cmd, db_url, "--processes", "2")
    supervised.append(s)

    async def spread() -> bool:
        return sorted(len(owned) for owned in (await children(conn, s.proc.pid)).values()) == [2, 2]

    await eventually(spread, timeout=30, what="both relay processes to claim their share")
    victim = next(iter(await children(conn, s.proc.pid)))
    before = await publish_each(conn, names, 50)
    os.kill(victim, signal.SIGKILL)
    after = await publish_each(conn, names, 50)

    async def restarted() -> bool:
        now = {pid: owned for pid, owned in (await children(conn, s.proc.pid)).items() if pid != victim}
        return len(now) == 2 and sum(len(o) for o in now.values()) == 4

    await eventually(restarted, timeout=30, what="the killed process to be replaced")
    assert s.logged("was killed by SIGKILL") == 1 and s.logged("restarting it in") == 1

    async def everything() -> bool:
        return (before | after) <= set(received_ids(receiver))

    await eventually(everything, timeout=30, what="every event, those of the killed process included")

    pids = list(await children(conn, s.proc.pid))
    s.proc.kill()
    s.proc.wait()

    async def orphans_gone() -> bool:
        return not [pid for pid in pids if alive(pid)]

    await eventually(orphans_gone, timeout=5, what="the children of the SIGKILLed supervisor to die")


async def test_sighup_is_ignored_and_a_child_stopped_cleanly_is_restarted_without_counting_a_crash(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, supervised: list[Supervised]
) -> None:
    """Outside probe: SIGHUP ended the supervisor at once (exit 129, nothing logged, nothing released),
    and a child stopped by SIGTERM (exit 0) counted as a crash towards the give-up."""
    s = Supervised(pgferry_cmd, db_url, "--processes", "2")
    supervised.append(s)

    async def both() -> bool:
        return len(await children(conn, s.proc.pid)) == 2

    await eventually(both, timeout=30, what="both relay processes")
    s.proc.send_signal(signal.SIGHUP)
    victim = next(iter(await children(conn, s.proc.pid)))
    os.kill(victim, signal.SIGTERM)

    async def restarted() -> bool:
        return len([pid for pid in await children(conn, s.proc.pid) if pid != victim and alive(pid)]) == 2

    await eventually(restarted, timeout=30, what="the stopped process to be started again")
    assert s.proc.poll() is None, s.lines[-5:]
    assert s.logged("SIGHUP received: pgferry has nothing to reload; ignored") == 1, s.lines
    assert s.logged("stopped cleanly after") == 1 and s.logged("crash") == 0, s.lines


async def test_a_process_crashing_in_a_loop_makes_the_supervisor_give_up(db_url: str) -> None:
    crash = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"]
    supervisor = Supervisor(
        db_url, RelaySettings(), SupervisorSettings(processes=2, restart_base=0.01, give_up_after=3), crash
    )
    with pytest.raises(GaveUp, match=r"relay process \d crashed 3 times in a row, .*exited \(3\)\); giving up"):
        await asyncio.wait_for(supervisor.run(asyncio.Event()), 30)
    assert all(slot.proc is not None and slot.proc.returncode is not None for slot in supervisor.slots)


async def test_processes_must_be_at_least_one_and_at_most_eight_per_core(pgferry_cmd: list[str], db_url: str) -> None:
    done = await cli(pgferry_cmd, db_url, "run", "--processes", "0")
    assert done.returncode == 2
    assert "Invalid value for --processes: must be at least 1 (got 0)" in done.stderr
    done = await cli(pgferry_cmd, db_url, "run", "--processes", "100000")  # a typo started 100,000
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"100000 is more than 8 per usable core ({8 * usable_cores()} here)" in done.stderr
