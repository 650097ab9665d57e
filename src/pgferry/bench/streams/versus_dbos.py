"""5. DBOS streams side by side: one writer and one reader of one stream, DBOS's and pgferry's, on the same server.

Issue 13 quotes DBOS streams at 180-220 writes/s with a reader on this machine and
a p99 of 0.4-0.8 s, and asks for 20x the throughput at a tenth of the latency. The
same run measures both, one after the other, against the same PostgreSQL:

- DBOS (``dbos_side.py`` in the Python given with ``--dbos-python``): a workflow
  writing ``DBOS.write_stream`` as fast as it goes (each write is a step of the
  workflow: its own transaction), a ``DBOSClient`` with LISTEN/NOTIFY reading
  ``read_stream``, each in its own process; the system database is a scratch
  database on the same server.
- pgferry: ``bench.streams.writer`` (``Ferry.publish``, one event per call) with one
  task (one call at a time, as the workflow writes) and with 16 (an application's
  request handlers), ``bench.streams.pyreader`` (``Ferry.read_stream``) reading; the
  relay (`pgferry run`) ticks.

Latency is from the value's stamp (taken in Python just before the write call) to
the reader's receipt, over the events written after the first second.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from pgferry.bench.context import database_url
from pgferry.bench.report import Latency, ms, num, table
from pgferry.bench.streams.common import WARM_UP_S, Bench, api_relay, close_streams, progress, read_result
from pgferry.errors import PgferryError

DBOS_DATABASE = "pgferry_bench_dbos"
#: Issue 13: pgferry at least this many times DBOS's writes/s, at most this share of its p99.
THROUGHPUT_FACTOR, LATENCY_SHARE = 20.0, 0.1
#: Run by the other Python with -P: its folder must not come first on sys.path (this module's would shadow
#: packages of the same names).
SIDE = Path(__file__).with_name("dbos_side.py")


@dataclass
class SideRow:
    system: str
    writer: str
    written: int
    seconds: float
    read: int
    latency: Latency

    @property
    def rate(self) -> float:
        return self.written / self.seconds if self.seconds else 0.0


async def _start(*command: str) -> asyncio.subprocess.Process:
    """A process that says ``started`` once ready."""
    proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.strip() != b"started":
        raise PgferryError(f"{' '.join(command[:3])} ... did not start (exit status {await proc.wait()})")
    return proc


async def _result(proc: asyncio.subprocess.Process, out: Path, timeout: float) -> dict[str, Any]:
    """What the process wrote to ``out`` (its ``--out``) once it has exited."""
    await asyncio.wait_for(proc.communicate(), timeout)
    return read_result(out, proc.returncode, "a side-by-side process")


def _steady(latencies: list[list[float]]) -> Latency:
    """Latencies of the values written after the first WARM_UP_S (from the first value's stamp)."""
    stamps = [at - lat / 1000 for at, lat in latencies]
    since = min(stamps, default=0.0) + WARM_UP_S
    return Latency.of([lat for (_, lat), stamp in zip(latencies, stamps, strict=True) if stamp >= since])


async def _pgferry(bench: Bench, tasks: int, seconds: float, tmp: Path) -> SideRow:
    stream = f"side:{tasks}"
    read_out, wrote_out = tmp / f"pgferry-read-{tasks}.json", tmp / f"pgferry-wrote-{tasks}.json"
    reader = await _start(sys.executable, "-m", "pgferry.bench.streams.pyreader", "--url", bench.url,
                          "--stream", stream, "--out", str(read_out))  # fmt: skip
    try:
        await asyncio.sleep(1.0)  # listening for ticks
        writer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pgferry.bench.streams.writer",
            "--url",
            bench.writer_url,
            "--stream",
            stream,
            "--tasks",
            str(tasks),
            "--seconds",
            str(seconds),
            "--out",
            str(wrote_out),
        )
        wrote = await _result(writer, wrote_out, seconds + 60)
        await close_streams(bench.url, [stream])
        read = await _result(reader, read_out, 120)
    finally:
        if reader.returncode is None:
            reader.kill()
            await reader.wait()
    label = "1 task, one publish() at a time" if tasks == 1 else f"{tasks} tasks (pool of {tasks})"
    return SideRow(
        "pgferry",
        label,
        int(wrote["published"]),
        float(wrote["seconds"]),
        int(read["events"]),
        _steady(read["latencies"]),
    )


async def _dbos(python: Path, url: str, seconds: float, listen_notify: bool, tmp: Path) -> SideRow:
    workflow = f"pgferry-bench-{time.time_ns()}"
    common = ["--url", url, "--workflow-id", workflow]
    wrote_out, read_out = tmp / f"{workflow}-wrote.json", tmp / f"{workflow}-read.json"
    writer = await _start(str(python), "-P", str(SIDE), "write", *common, "--seconds", str(seconds), "--lead", "2",
                          "--out", str(wrote_out))  # fmt: skip
    try:
        reader = await _start(str(python), "-P", str(SIDE), "read", *common, "--out", str(read_out),
                              *(["--listen-notify"] if listen_notify else []))  # fmt: skip
        try:
            wrote = await _result(writer, wrote_out, seconds + 120)
            read = await _result(reader, read_out, 120)
        finally:
            if reader.returncode is None:
                reader.kill()
                await reader.wait()
    finally:
        if writer.returncode is None:
            writer.kill()
            await writer.wait()
    return SideRow(
        "DBOS",
        "1 workflow; reader " + ("LISTEN/NOTIFY" if listen_notify else "polling (the client's default)"),
        int(wrote["written"]),
        float(wrote["seconds"]),
        int(read["events"]),
        _steady(read["latencies"]),
    )


async def run_dbos(bench: Bench, python: Path, seconds: float) -> None:
    progress(f"[dbos] DBOS streams ({python}) and pgferry, one writer and one reader each, {seconds:g} s ...")
    rows: list[SideRow] = []
    dbos_url = database_url(bench.admin_url, DBOS_DATABASE)
    await bench.admin.execute(f"drop database if exists {DBOS_DATABASE} with (force)")
    with tempfile.TemporaryDirectory(prefix="pgferry-bench-dbos-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            for listen_notify in (False, True):
                rows.append(await _dbos(python, dbos_url, seconds, listen_notify, tmp))
                progress(f"[dbos]   DBOS, {rows[-1].writer}: {rows[-1].rate:,.0f} writes/s, "
                         f"p99 {ms(rows[-1].latency.p99)} ms")  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                await bench.admin.execute(f"drop database if exists {DBOS_DATABASE} with (force)")
        async with api_relay(bench.url, 2 * seconds + 300):
            for tasks in (1, 16):
                rows.append(await _pgferry(bench, tasks, seconds, tmp))
                progress(f"[dbos]   pgferry, {tasks} task(s): {rows[-1].rate:,.0f} writes/s, "
                         f"p99 {ms(rows[-1].latency.p99)} ms")  # fmt: skip
    base, notified = rows[0], rows[1]
    click.echo(
        f"\n5. DBOS streams side by side: one writer and one reader of one stream, {seconds:g} s each, same server; "
        "DBOS: a workflow calling DBOS.write_stream in a loop, a DBOSClient reading read_stream (as it comes, "
        "polling; then with use_listen_notify=True); pgferry: Ferry.publish from one process, Ferry.read_stream "
        "reading, `pgferry run` ticking"
    )
    click.echo(
        table(
            [
                "system",
                "writer",
                "written",
                "writes/s",
                "read",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "writes/s vs DBOS",
                "p99 vs DBOS",
                "p99 vs DBOS notify",
            ],
            [
                [
                    r.system,
                    r.writer,
                    num(r.written),
                    num(r.rate),
                    num(r.read),
                    ms(r.latency.p50),
                    ms(r.latency.p90),
                    ms(r.latency.p99),
                    ms(r.latency.max),
                    f"{r.rate / base.rate:.1f}x" if base.rate else "-",
                    f"{r.latency.p99 / base.latency.p99:.3f}x" if base.latency.p99 else "-",
                    f"{r.latency.p99 / notified.latency.p99:.2f}x" if notified.latency.p99 else "-",
                ]
                for r in rows
            ],
        )
    )
    click.echo(
        "   latency: the reader's wall clock when a value arrives minus its stamp, taken in Python just before "
        f"its write call, for the values written after the first {WARM_UP_S:g} s; read: values the reader "
        "got (all of them: the stream is closed after the writer); vs DBOS: against DBOS's first row (its client "
        "as it comes), vs DBOS notify: against its second"
    )
    bench.results["dbos"] = [vars(r) | {"latency": vars(r.latency), "rate": r.rate} for r in rows]
    for r in rows:
        bench.target(
            "dbos", f"{r.system}, {r.writer}: every value read", f"{r.written:,}", f"{r.read:,}", r.read == r.written
        )
    # The target is against DBOS as it measured it (its client as it comes: polling); the
    # LISTEN/NOTIFY reader is in the table for comparison, not a target.
    best = max((r for r in rows if r.system == "pgferry"), key=lambda r: r.rate)
    bench.target(
        "dbos",
        f"pgferry ({best.writer}) vs DBOS ({base.writer.removeprefix('1 workflow; ')})",
        f">= {THROUGHPUT_FACTOR:g}x writes/s, <= {LATENCY_SHARE:g}x p99",
        f"{best.rate / base.rate:.1f}x, {best.latency.p99 / base.latency.p99:.3f}x",
        best.rate >= THROUGHPUT_FACTOR * base.rate and best.latency.p99 <= LATENCY_SHARE * base.latency.p99,
    )
