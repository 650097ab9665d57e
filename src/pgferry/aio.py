"""Small asyncio helpers shared by the relay's loops."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Callable
from typing import Any


async def wait_for_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; return whether it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


def backoff_delay(failures: int, *, base: float = 0.1, cap: float = 10.0) -> float:
    """Exponential backoff with jitter (between half and all of the step)."""
    return float(min(cap, base * 2 ** min(failures, 30)) * random.uniform(0.5, 1.0))


class Slots:
    """A first-come, first-served semaphore whose ``acquire`` and ``release`` cost the same
    however many tasks wait.

    ``asyncio.Semaphore`` of Python 3.11 scans its waiters on every release (past those woken
    but not yet run) and on every acquire while any wait: with 1,000 subscriptions queued for
    the relay's requests in flight, that scan was 9% of the relay's CPU (`pgferry bench
    fanout`, py-spy). Here a release hands its slot to the first waiter still waiting, so a
    task arriving later cannot take it first; a waiter cancelled while it waits is skipped
    when its turn comes, and one cancelled just after it was handed a slot passes it on."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"slots must not be negative, got {value}")
        self._free = value
        # Only ever non-empty while no slot is free (a release hands its slot to a waiter
        # before it counts it free); cancelled waiters stay until a release reaches them.
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        """Whether an ``acquire`` now would wait."""
        return self._free == 0

    async def acquire(self) -> None:
        if self._free > 0:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if not waiter.done():
                waiter.cancel()  # ended otherwise than by a cancel (close, throw): never handed a slot
            elif not waiter.cancelled():
                self.release()  # handed a slot as it was cancelled: the slot goes on
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Wake:
    """A flag a task waits on together with a future, without a task per wait.

    A subscription's worker waits, between each of its batches, for its oldest batch in flight
    or for the LogWatch's wake-up. ``asyncio.wait`` on that batch and on a task of
    ``Event.wait()`` made a task, two futures and their callbacks every time: 8% of the relay's
    CPU with 1,000 subscriptions at 1,000 deliveries a second (py-spy, `bench fanout --rate 1`).
    """

    __slots__ = ("_callbacks", "_set")

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def clear(self) -> None:
        self._set = False

    async def wait(self, head: asyncio.Future[Any] | None = None) -> None:
        """Until the flag is set, or ``head`` is done."""
        if self._set or (head is not None and head.done()):
            return
        done = asyncio.get_running_loop().create_future()

        def finish(_: object = None) -> None:
            if not done.done():
                done.set_result(None)

        self._callbacks.append(finish)
        if head is not None:
            head.add_done_callback(finish)
        try:
            await done
        finally:
            if head is not None:
                head.remove_done_callback(finish)
            with contextlib.suppress(ValueError):  # called already by set()
                self._callbacks.remove(finish)
