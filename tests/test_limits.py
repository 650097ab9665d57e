"""Raising the limit of open files, in processes of their own (limits are per process)."""

from __future__ import annotations

import subprocess
import sys

from pgferry.delivery.fasthttp import MAX_IDLE


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return [*done.stdout.split(), done.stderr]


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard, _ = _run(
        "import resource\n"
        "from pgferry.limits import raise_open_files\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(raise_open_files('test', 10_000), hard)\n"
    )
    assert soft == hard


def test_a_relay_under_a_low_limit_keeps_fewer_idle_connections_and_says_so() -> None:
    def idle_under(hard_limit: int) -> tuple[int, str]:
        idle, log = _run(
            "import logging, resource\n"
            "from pgferry.relay.process import Relay\n"
            "logging.basicConfig(level=logging.INFO)\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({hard_limit}, {hard_limit}))\n"
            "print(Relay('postgresql://unused')._idle_connections())\n"
        )
        return int(idle), log

    idle, log = idle_under(1_000)
    assert idle == 64
    assert "may open 1000 files: keeping 64 idle webhook connections, not 4096" in log
    assert "raise the limit (ulimit -n" in log
    idle, log = idle_under(10_000)
    assert idle == MAX_IDLE and "WARNING" not in log
