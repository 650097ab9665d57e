"""Running pgbench as the write load, and reading back what it measured.

pgbench (C, one connection per client) drives the server harder than any
Python client could on the same two cores, so insert throughput reflects the
database, not the load generator. Latency percentiles come from its
per-transaction log (``-l``), which its summary does not report.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pgferry.bench.report import Latency
from pgferry.errors import PgferryError


class PgbenchError(PgferryError):
    """pgbench is missing or failed in a way that makes its numbers meaningless."""


@dataclass
class PgbenchRun:
    """What one pgbench run measured."""

    clients: int
    #: the -T duration, or the measured wall time of a -t run
    seconds: float
    transactions: int
    failed: int
    tps: float
    latencies_ms: list[float] = field(repr=False)
    aborted_clients: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def latency(self) -> Latency:
        return Latency.of(self.latencies_ms)

    @property
    def success_rate(self) -> float:
        """Share of transactions that committed; a client pgbench aborted counts as failing."""
        attempted = self.transactions + self.failed + self.aborted_clients
        return 100.0 * self.transactions / attempted if attempted else float("nan")


#: how long a ``transactions=`` run may take before it is killed
MAX_TRANSACTIONS_RUN_S = 600.0

_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
_FAILED = re.compile(r"number of failed transactions: (\d+)")
_TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")
_ABORTED = re.compile(r"client \d+ aborted|client \d+ script \d+ aborted")


def find_pgbench() -> str:
    path = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if not path:
        raise PgbenchError("pgbench not found: install the PostgreSQL client tools (e.g. `apt-get install postgresql`)")
    return str(path)


async def run_pgbench(
    url: str,
    script: str,
    *,
    clients: int,
    seconds: float | None = None,
    transactions: int | None = None,
    rate: float | None = None,
    per_statement: bool = False,
    timeout: float = MAX_TRANSACTIONS_RUN_S,
) -> PgbenchRun:
    """Run ``script`` with ``clients`` connections (no vacuum, prepared statements).

    Either for ``seconds`` (``-T``) or for ``transactions`` per client (``-t``,
    killed after ``timeout`` seconds so a stuck run still ends).
    """
    if (seconds is None) == (transactions is None):
        raise ValueError("give exactly one of seconds or transactions")
    limit = seconds + 120 if seconds is not None else timeout
    with tempfile.TemporaryDirectory(prefix="pgferry-bench-") as tmp:
        script_file = Path(tmp) / "script.sql"
        script_file.write_text(script, encoding="utf-8")
        cmd = [
            find_pgbench(),
            "-n",  # no vacuum of pgbench's own tables: we have none
            "-M", "prepared",
            "-f", str(script_file),
            *(["-T", str(max(1, round(seconds)))] if seconds is not None else ["-t", str(transactions)]),
            "-c", str(clients),
            "-j", str(min(2, clients)),
            "-l", f"--log-prefix={tmp}/tx",
        ]  # fmt: skip
        if rate is not None:
            cmd += ["-R", str(rate)]
        if per_statement:
            cmd.append("-r")
        cmd.append(url)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=tmp
        )
        try:
            out_b, err_b = await asyncio.wait_for(proc.communicate(), timeout=limit)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PgbenchError(f"pgbench did not finish within {limit:.0f} s") from None
        elapsed = time.monotonic() - started
        out, err = out_b.decode(errors="replace"), err_b.decode(errors="replace")
        processed = _PROCESSED.search(out)
        tps = _TPS.search(out)
        if processed is None or tps is None:
            raise PgbenchError(f"pgbench failed (exit {proc.returncode}):\n{err.strip() or out.strip()}")
        failed = _FAILED.search(out)
        latencies, log_failed = _read_logs(Path(tmp))
        error_lines = [line for line in err.splitlines() if "ERROR" in line or "aborted" in line]
        return PgbenchRun(
            clients=clients,
            seconds=seconds if seconds is not None else elapsed,
            transactions=int(processed[1]),
            failed=max(int(failed[1]) if failed else 0, log_failed),
            tps=float(tps[1]),
            latencies_ms=latencies,
            aborted_clients=len(_ABORTED.findall(err)),
            errors=error_lines[:5],
        )


def _read_logs(directory: Path) -> tuple[list[float], int]:
    """Latencies (ms) and failures from pgbench's per-transaction logs.

    Each line is ``client_id transaction_no time script_no time_epoch time_us
    [schedule_lag]``; ``time`` is in microseconds, or ``failed``/``skipped``.
    """
    latencies: list[float] = []
    failed = 0
    for log_file in directory.glob("tx.*"):
        with log_file.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                fields = line.split()
                if len(fields) < 3:
                    continue
                if fields[2].isdigit():
                    latencies.append(int(fields[2]) / 1000.0)
                elif fields[2] == "failed":
                    failed += 1
    return latencies, failed
