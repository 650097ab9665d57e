"""Splitting the machine's cores between the application and pgferry (``--pin APP:FERRY``).

When the writers alone keep every core busy, whatever pgferry runs beside them (a relay,
the server's WAL decoding, a backfill's backend) takes CPU from them, and the writers'
throughput then measures how the scheduler shares the cores, not what capture costs a
writer. In production the relay runs on its own host and the backend that decodes the
WAL or reads a backfill is one of the server's many cores. ``--pin 0:1`` stands for that
on a small machine: the application's side (pgbench, and the server backends serving
it) runs on CPU 0, pgferry's side (this process and its children, their threads, and
the backends serving them, the walsender among them) on CPU 1, in every cell of the
run, the baseline included. The server's own background processes (WAL writer,
checkpointer) are left wherever the scheduler puts them.

The pinning is done from outside, by process id, so it needs the right to change other
processes' affinity (root, or the same user).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import click

from pgferry import db

#: How often new processes (pgbench and its backends start with each cell) are pinned.
PIN_EVERY_S = 0.02


@dataclass(frozen=True)
class CoreSplit:
    """CPUs for the application's side and for pgferry's side."""

    app: frozenset[int]
    ferry: frozenset[int]

    def __str__(self) -> str:
        return f"application on CPU {_cpus(self.app)}, pgferry on CPU {_cpus(self.ferry)}"


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_split(text: str) -> CoreSplit:
    """'0:1' or '0,1:2,3' -> a CoreSplit; a clear click error otherwise."""
    available = os.sched_getaffinity(0)
    app_text, sep, ferry_text = text.partition(":")
    try:
        if not sep:
            raise ValueError
        app = frozenset(int(c) for c in app_text.split(","))
        ferry = frozenset(int(c) for c in ferry_text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: give APP:FERRY CPU lists, e.g. 0:1 or 0,1:2,3") from None
    if app & ferry:
        raise click.BadParameter(f"{text!r}: the two sides share CPU {_cpus(app & ferry)}")
    if not (app | ferry) <= available:
        raise click.BadParameter(
            f"{text!r}: CPU {_cpus((app | ferry) - available)} not available here "
            f"(this process may use {_cpus(frozenset(available))})"
        )
    return CoreSplit(app, ferry)


def _pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (a process's affinity is per thread)."""
    try:
        tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return  # gone already
    for tid in tasks:
        with contextlib.suppress(OSError):  # a thread or process that ended meanwhile
            if os.sched_getaffinity(tid) != cpus:
                os.sched_setaffinity(tid, cpus)


def _pgbench_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "pgbench":
                    pids.append(int(entry.name))
    return pids


@contextlib.asynccontextmanager
async def pinned(split: CoreSplit | None, url: str) -> AsyncIterator[None]:
    """While inside: this process on pgferry's CPUs (its children inherit them), pgbench and
    its backends on the application's, every other client backend and walsender on pgferry's.
    ``split`` None: nothing is pinned."""
    if split is None:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    _pin(os.getpid(), split.ferry)
    conn = await db.connect(url)
    stop = asyncio.Event()
    backends: set[int] = set()

    async def keep_pinned() -> None:
        while not stop.is_set():
            rows = await conn.fetch(
                "select pid, application_name = 'pgbench' as app from pg_stat_activity "
                "where backend_type in ('client backend', 'walsender') and datname = current_database()"
            )
            for row in rows:
                backends.add(row["pid"])
                _pin(row["pid"], split.app if row["app"] else split.ferry)
            for pid in _pgbench_pids():
                _pin(pid, split.app)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PIN_EVERY_S)

    task = asyncio.create_task(keep_pinned())
    try:
        yield
    finally:
        stop.set()
        await task
        await conn.close()
        for pid in {os.getpid(), *backends}:  # the backends still open are the server's to place again
            _pin(pid, before)
