"""Rolling per-second counters, so `pgferry status` can show rates without scanning attempts."""

from __future__ import annotations

import time
from collections import deque


class RollingCounter:
    """Counts events per second over the last ``window`` seconds."""

    def __init__(self, window: int = 300) -> None:
        self.window = window
        self._buckets: deque[list[int]] = deque()  # [second, count]
        self.total = 0

    def add(self, n: int = 1, now: float | None = None) -> None:
        if n <= 0:
            return
        second = int(now if now is not None else time.time())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
        self.total += n
        self._trim(second)

    def last(self, seconds: int, now: float | None = None) -> int:
        current = int(now if now is not None else time.time())
        self._trim(current)
        return sum(count for second, count in self._buckets if second > current - seconds)

    def _trim(self, current: int) -> None:
        while self._buckets and self._buckets[0][0] <= current - self.window:
            self._buckets.popleft()
