"""Rolling per-second counters, so `pgferry status` can show rates without scanning attempts."""

from __future__ import annotations

import time
from collections import deque


class RollingCounter:
    """Counts events per second over the last ``window`` seconds.

    The relay reports every subscription's counts of the last minute and the last five minutes
    each ownership round; summing up to 300 buckets per count, three counts per subscription,
    was a third of that round with 1,000 subscriptions (py-spy). The whole window's sum is kept
    as buckets come and go, and a shorter one is summed from the newest bucket back."""

    def __init__(self, window: int = 300) -> None:
        self.window = window
        self._buckets: deque[list[int]] = deque()  # [second, count], oldest first
        self._in_window = 0  # the sum of the buckets' counts
        self.total = 0

    def add(self, n: int = 1, now: float | None = None) -> None:
        if n <= 0:
            return
        second = int(now if now is not None else time.time())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
        self._in_window += n
        self.total += n
        self._trim(second)

    def last(self, seconds: int, now: float | None = None) -> int:
        current = int(now if now is not None else time.time())
        self._trim(current)
        if seconds >= self.window:
            return self._in_window
        counted = 0
        for second, count in reversed(self._buckets):  # newest first (a clock set back: ends early)
            if second <= current - seconds:
                break
            counted += count
        return counted

    def _trim(self, current: int) -> None:
        while self._buckets and self._buckets[0][0] <= current - self.window:
            self._in_window -= self._buckets.popleft()[1]
