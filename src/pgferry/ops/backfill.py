"""Running a backfill from a terminal: its chunks run in this process, with a progress bar, until
it ends, or it is paused on Ctrl-C or SIGTERM.

``pgferry backfill`` (cli/backfill.py) and the demo (demo.py) both drive a backfill so; the engine
that runs the chunks is capture/backfill.py's ``BackfillRunner``, which knows nothing of terminals.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from rich import get_console
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

import pgferry
from pgferry.capture import backfill as backfills


def rows_text(done: int, total: int | None) -> str:
    """A backfill's rows done against its estimate ("?" for a table never analysed)."""
    return f"{done:,} / ~{total:,}" if total is not None else f"{done:,} / ?"


#: What a backfill runner reports after each chunk: rows done, estimate of the total, chunk rows.
Observe = Callable[[int, int | None, int], None]

#: Seconds between two progress lines when the output is not a terminal (a log, a pipe).
LINE_EVERY = 10.0


class ProgressLines:
    """The progress bar's content as a line every LINE_EVERY seconds, for output that is not a
    terminal (a log, a pipe): there the bar came out once, at the end, cut at 80 columns
    ("207,… 0:00:…")."""

    def __init__(self, console: Console, what: str, done: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.what = what
        self.clock = clock
        self.started = clock()
        self.first = done
        self.said = self.started
        self.done = done
        self.total: int | None = None

    def update(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        if self.clock() - self.said >= LINE_EVERY:
            self.say()

    def say(self) -> None:
        self.said = self.clock()
        elapsed = self.said - self.started
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        line = f"{self.what}: {rows_text(self.done, self.total)} rows"
        if self.total:
            line += f" ({min(100, 100 * self.done // self.total)}%)"
        line += f", {rate:,.0f} rows/s"
        if self.total and rate > 0 and self.total > self.done:
            line += f", about {timedelta(seconds=round((self.total - self.done) / rate))} left"
        self.console.print(line, highlight=False, soft_wrap=True)


class RateColumn(ProgressColumn):
    """Rows per second of this run: rich's average over the chunks of the last 30 s (the rate in
    `pgferry status` is since the backfill's start, pauses included)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed is not None else "? rows/s", style="progress.data.speed")


async def drive(
    ferry: pgferry.Ferry,
    backfill: int,
    show: bool,
    max_rate: float | None,
    stop: asyncio.Event | None = None,
    *,
    console: Console | None = None,
) -> backfills.Progress:
    """Run the backfill's chunks here, with a progress bar on ``console`` if ``show``, until it ends
    or ``stop`` is set (then it is paused after the chunk in progress). Without ``stop``: Ctrl-C or
    SIGTERM, and a second one stops the chunk in progress at once (its statement is cancelled and
    rolled back): a chunk waiting on a lock made both signals wait for it, silently (outside probe)."""
    signals = None
    if stop is None:
        signals = _Signals(backfill)
        stop = signals.stop
    try:
        try:
            return await _drive(ferry, backfill, show, max_rate, stop, console)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            # Only our own cancel (the second signal) is a pause; any other goes on up.
            if signals is None or not signals.cancelled or task is None or task.uncancel() > 0:
                raise
        async with ferry.pool.acquire() as conn:  # a fresh connection: the cancelled one may still be resetting
            if (await backfills.progress(conn, backfill)).state == "running":  # not if it ended meanwhile
                await backfills.set_state(conn, backfill, "pause")
            return await backfills.progress(conn, backfill)
    finally:
        if signals is not None:
            signals.close()


class _Signals:
    """SIGINT/SIGTERM while a backfill runs here: the first sets ``stop`` (pause after the chunk in
    progress), the second cancels the driving task once (the chunk's statement is cancelled), later
    ones only say it is stopping (a third Ctrl-C cancelled the pause under way: a traceback)."""

    def __init__(self, backfill: int) -> None:
        self.backfill = backfill
        self.stop = asyncio.Event()
        self.cancelled = False
        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(signum, self._signalled)

    def _signalled(self) -> None:
        if not self.stop.is_set():
            self.stop.set()
            self._say("pausing after the chunk in progress (again to stop it now)")
        elif not self.cancelled and self.task is not None:
            self.cancelled = True
            self.task.cancel()
            self._say("stopping the chunk in progress")
        else:
            self._say("still stopping")

    def _say(self, what: str) -> None:
        sys.stderr.write(f"\nbackfill {self.backfill}: {what}\n")

    def close(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.loop.remove_signal_handler(signum)


async def _drive(
    ferry: pgferry.Ferry,
    backfill: int,
    show: bool,
    max_rate: float | None,
    stop: asyncio.Event,
    console: Console | None,
) -> backfills.Progress:
    async with ferry.pool.acquire() as conn:
        # Idle through the pauses between tries (up to 12.8 s) and --max-rate's: a database's
        # idle_session_timeout ended the session mid-backfill (outside probe). Reset on release.
        await conn.execute("set idle_session_timeout = 0")
        first = await backfills.progress(conn, backfill)
        settings = backfills.BackfillSettings(backfill, max_rate=max_rate)
        with _shown(console or get_console(), f"backfill {backfill} of {first.table}", first, show) as observe:
            state = await backfills.BackfillRunner(conn, settings, observe=observe).run(stop)
            if state == "running":  # stopped by a signal
                await backfills.set_state(conn, backfill, "pause")
            last = await backfills.progress(conn, backfill)
            if last.state == "done":  # the estimate was only that (a table never analysed: any number)
                observe(last.rows_done, last.rows_done, 0)
        return last


@contextlib.contextmanager
def _shown(console: Console, what: str, first: backfills.Progress, show: bool) -> Iterator[Observe]:
    """What observes the chunks: a progress bar on a terminal, a line now and then otherwise."""
    if show and not console.is_terminal:  # the end is said by the caller's report
        lines = ProgressLines(console, what, first.rows_done)
        yield lambda done, estimate, _chunk: lines.update(done, _total(done, estimate))
        return
    with Progress(
        TextColumn(what), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[rows]} rows"), RateColumn(), TimeRemainingColumn(),
        console=console, disable=not show, transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task(
            "rows", total=first.total, completed=first.rows_done, rows=rows_text(first.rows_done, first.total)
        )

        def observe(done: int, estimate: int | None, _chunk: int) -> None:
            total = _total(done, estimate)
            bar.update(task, completed=done, total=total, rows=rows_text(done, total))

        yield observe


def _total(done: int, estimate: int | None) -> int | None:
    """The estimate of the table's rows; None (unknown) once the rows done passed it (Progress.total)."""
    return None if estimate is None or done > estimate else estimate
