"""Requests in flight: the relay's ``max_in_flight`` over all subscriptions, and each
subscription's fair share of it.

A subscription may have its own ``max_in_flight`` (32 by default) requests in flight, but
not more than its share of the relay's: the relay's limit divided among the subscriptions
that have requests to send right now (at least MIN_SHARE each). One busy subscription still
gets the whole relay; 1,000 busy ones get two requests each instead of queueing 32 each
behind the relay's 1,024 slots. What that prevents is connections: every request in flight
holds a connection to its endpoint, so 1,000 endpoints taking up to 32 requests each, a few
at a time, opened more connections than the relay keeps idle, and each request then opened
a new one (`bench fanout`: 70,000 connections for 100,000 requests, the receiver swamped,
answers a minute late). With the share, each endpoint's connections stay about as many as
its share, and they are reused.

A request let go of by its round (delivery.sending) keeps its place until it is answered, so
an endpoint that stopped answering as a whole gets no more than its share either.
"""

from __future__ import annotations

import asyncio
from collections import deque

from pgferry.aio import Slots

#: Requests any subscription with something to send may have in flight, however many others
#: do: one may hang (until its round lets go of it) while the next goes out.
MIN_SHARE = 2


class RelayInFlight:
    """The relay's limit on requests in flight, and how many subscriptions share it now."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {total}")
        self.total = total
        self.slots = Slots(total)
        #: subscriptions with requests in flight or waiting to be
        self.active = 0

    def share(self) -> int:
        """What each active subscription may have in flight now."""
        return max(MIN_SHARE, self.total // max(1, self.active))

    async def __aenter__(self) -> None:
        await self.slots.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.slots.release()


class SubscriptionInFlight:
    """One subscription's requests in flight: at most ``most`` (its max_in_flight) and its
    share of the relay's. Enter it before the relay's own limit. The share is checked as a
    request starts: one that sent more while it had the relay to itself is not cut short,
    it gets no more until it is back under its share."""

    def __init__(self, most: int, relay: RelayInFlight) -> None:
        self.most = most
        self.relay = relay
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._counted = False  # counted in relay.active

    def limit(self) -> int:
        return min(self.most, self.relay.share())

    async def __aenter__(self) -> None:
        while self.used >= self.limit():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._count()
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken as it was cancelled: the place goes to the next
                elif waiter in self._waiters:  # not yet passed over by _wake
                    self._waiters.remove(waiter)
                self._count()
                raise
        self.used += 1
        self._count()

    async def __aexit__(self, *exc: object) -> None:
        self.used -= 1
        self._wake()
        self._count()

    def _wake(self) -> None:
        """Wakes the first waiter, if there is room (it checks again when it runs)."""
        while self._waiters and self.used < self.limit():
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _count(self) -> None:
        active = self.used > 0 or bool(self._waiters)
        if active != self._counted:
            self._counted = active
            self.relay.active += 1 if active else -1
