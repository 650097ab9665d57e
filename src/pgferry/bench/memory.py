"""`pgferry bench memory`: the relay's peak memory on a backlog of large events.

Why: a relay read a whole batch into memory at once; a backlog of 1,500
captured rows of ~600 KB took it to 1,274 MB, and 5,000 events of 1 MB
would take gigabytes (issue 16). This fills a captured table with large
rows, several per transaction and a tick after each (a burst of large
writes), subscribes a receiver in this process, then starts `pgferry run`
on the backlog and waits until every event is delivered. It reports the
relay's peak resident memory (VmHWM, Linux /proc), its memory at start,
the time taken, and how many events arrived more than once (none should:
nothing fails in this run).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import click

from pgferry.bench.context import BenchContext
from pgferry.bench.procstat import memory_mb
from pgferry.bench.relay import running_relay
from pgferry.bench.report import num, table
from pgferry.bench.sqlfiles import named
from pgferry.receiver import Action, Received, Receiver, Respond


@dataclass
class MemoryResult:
    events: int
    event_kb: int
    max_batch_bytes: str
    seconds: float
    start_mb: float
    peak_mb: float
    duplicates: int


def _q(name: str) -> str:
    return named("memory.sql", name)


async def run_memory_bench(
    ctx: BenchContext,
    events: int,
    event_kb: int,
    per_transaction: int,
    max_batch_bytes: str | None,
    timeout: float,
    *,
    random_text: bool = False,
) -> MemoryResult:
    """``random_text``: rows of text that does not compress, ticked once at the end (one range)."""
    seen: Counter[str] = Counter()

    def count(request: Received) -> Action:
        seen[request.headers.get("webhook-id", "")] += 1
        return Respond()

    receiver = Receiver(count, keep=False)
    url = await receiver.start()
    try:
        async with ctx.connect() as conn:
            await conn.execute(_q("create_table"))
            await conn.execute(_q("capture"))
            await conn.execute(_q("subscribe"), url)
            ctx.progress(f"filling the log: {events} rows of {event_kb} KB, {per_transaction} a transaction"
                         + (", random text, one tick" if random_text else ""))  # fmt: skip
            left = events
            while left > 0:
                await conn.execute(_q("fill_random" if random_text else "fill"), min(per_transaction, left),
                                   event_kb * 1024)  # fmt: skip
                if not random_text:
                    await conn.execute(_q("tick"))
                left -= per_transaction
            await conn.execute(_q("tick"))
        args = [] if max_batch_bytes is None else ["--max-batch-bytes", max_batch_bytes]
        started = time.monotonic()
        async with running_relay(ctx.url, max_seconds=timeout, args=args) as proc:
            start_mb = memory_mb(proc.pid).get("VmRSS", 0.0)
            while sum(1 for n in seen.values() if n) < events:
                if proc.returncode is not None or time.monotonic() - started > timeout:
                    raise RuntimeError(f"the relay delivered {len(seen)} of {events} events (exit {proc.returncode})")
                await asyncio.sleep(0.1)
            seconds = time.monotonic() - started
            peak_mb = memory_mb(proc.pid).get("VmHWM", 0.0)
    finally:
        await receiver.stop()
    return MemoryResult(
        events=events,
        event_kb=event_kb,
        max_batch_bytes=max_batch_bytes or "default",
        seconds=seconds,
        start_mb=start_mb,
        peak_mb=peak_mb,
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
    )


def print_table(results: list[MemoryResult]) -> None:
    headers = ["events", "event KB", "--max-batch-bytes", "seconds", "RSS at start MB", "peak RSS MB", "duplicates"]
    rows = [
        [num(r.events), num(r.event_kb), r.max_batch_bytes, f"{r.seconds:.1f}", f"{r.start_mb:.0f}",
         f"{r.peak_mb:.0f}", num(r.duplicates)]
        for r in results
    ]  # fmt: skip
    click.echo(table(headers, rows))
