"""Fixtures for operator tests: the delivery tests' relay and receivers, and the CLI in a subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable

from pgferry.receiver import Receiver
from tests.delivery.conftest import relay

__all__ = ["MakeReceiver", "cli", "relay"]

MakeReceiver = Callable[..., Awaitable[tuple[Receiver, str]]]


async def cli(
    cmd: list[str], url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `pgferry ARGS` as a real subprocess against the test database."""
    return await asyncio.to_thread(
        subprocess.run,
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PGFERRY_DATABASE_URL": url, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "250",
             **(env or {})},
    )  # fmt: skip
