"""A real relay for the benchmark: `pgferry run` in its own process, as in production.

Running it out of process keeps the benchmark's own event loop (the stream
reader, the latency bookkeeping) from delaying the ticker, and vice versa.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import asyncpg

from pgferry import db
from pgferry.bench.sqlfiles import query
from pgferry.errors import PgferryError
from pgferry.relay.leader import TICKER_LOCK
from pgferry.schema import CONSUMER_LOCK_CLASS, LOCK_CLASS


class RelayFailed(PgferryError):
    """The relay subprocess exited or never became the ticker."""


async def wait_for_lock(
    conn: asyncpg.Connection, objid: int, what: str, timeout: float = 20.0, classid: int = LOCK_CLASS
) -> None:
    """Wait until some session holds pgferry's advisory lock ``objid`` (the ticker's, a reader's)."""
    deadline = time.monotonic() + timeout
    while not await conn.fetchval(query("advisory_lock_held"), classid, objid):
        if time.monotonic() > deadline:
            raise RelayFailed(f"{what} did not start within {timeout:.0f} s")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_relay(
    url: str, *, max_seconds: float, args: Sequence[str] = ()
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run `pgferry run --database-url URL [ARGS]` until the block ends (and never longer than
    ``max_seconds``); the block gets the process (the soak samples its memory and sockets).
    One relay process unless ARGS give --processes (the last one given wins).

    The block starts once the relay ticks and delivers every active subscription, so that
    a benchmark measures delivery, not the relay starting up."""
    with tempfile.TemporaryDirectory(prefix="pgferry-bench-relay-") as tmp:
        log_path = Path(tmp) / "relay.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pgferry", "run", "--database-url", url, "--exit-after", str(max_seconds),
                "--processes", "1", *args,
                stdout=log_file, stderr=log_file,
            )  # fmt: skip
            try:
                conn = await db.connect(url)
                try:
                    waiter = asyncio.create_task(wait_for_lock(conn, TICKER_LOCK, "the relay's ticker"))
                    exited = asyncio.create_task(proc.wait())
                    await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
                    if exited.done():
                        waiter.cancel()
                        raise RelayFailed(f"the relay exited with code {proc.returncode}:\n{_tail(log_path)}")
                    exited.cancel()
                    waiter.result()
                    # One query for all (one per consumer took 27 s of 10,000 round trips for 5,000).
                    deadline = time.monotonic() + 60
                    while waiting := await conn.fetch(query("active_consumers_undelivered"), CONSUMER_LOCK_CLASS):
                        if time.monotonic() > deadline:
                            raise RelayFailed(f"delivery of {waiting[0]['name']} (and {len(waiting) - 1} more) "
                                              "did not start within 60 s")  # fmt: skip
                        await asyncio.sleep(0.05)
                finally:
                    await conn.close()
                yield proc
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        await asyncio.wait_for(proc.wait(), 10)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()


@contextlib.asynccontextmanager
async def running_relays(url: str, *, relays: int, processes: int, max_seconds: float) -> AsyncIterator[None]:
    """``relays`` relays (`pgferry run --processes PROCESSES` each), until the block ends. The block
    starts once the relay processes have spread what there is to deliver (every one delivering
    something, or every consumer delivered), not while the first still holds everything."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(relays):
            await stack.enter_async_context(
                running_relay(url, max_seconds=max_seconds, args=("--processes", str(processes)))
            )
        conn = await db.connect(url)
        try:
            want = min(relays * processes, len(await conn.fetch(query("active_consumers"))))
            deadline = time.monotonic() + 30
            while await conn.fetchval(query("relays_delivering")) < want:
                if time.monotonic() > deadline:
                    raise RelayFailed(f"the {relays * processes} relay processes did not share the work within 30 s")
                await asyncio.sleep(0.1)
        finally:
            await conn.close()
        yield


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
