"""Small asyncio helpers shared by the relay's loops."""

from __future__ import annotations

import asyncio
import contextlib
import random


async def wait_for_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; return whether it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


def backoff_delay(failures: int, *, base: float = 0.1, cap: float = 10.0) -> float:
    """Exponential backoff with jitter (between half and all of the step)."""
    return float(min(cap, base * 2 ** min(failures, 30)) * random.uniform(0.5, 1.0))
