"""The relay's read budget: bytes of events read and not yet sent, over every subscription.

Each subscription's reads are bounded (``max_batch_bytes``, a third per read), but
nothing bounded the relay as a whole: 100 subscriptions with backlogs of large
events could each hold their 16 MB at once. The budget (``--max-read-bytes``) is
shared by every read of the relay's workers: the batch reads the Stepper sends
(many subscriptions in one statement) and the retry loops' reads of parked events.

Before a statement goes, the Stepper asks the budget for its reads: it gets a
bound for each (the statement's ``max_bytes``) and reserves that bound times the
reads. When the statement is answered, each read holds what it returned and the
rest of its reservation is given back. A worker gives its read back once the
batch is sent (its sending ended, delivered or parked), and holds no reference
to it after that. A read that finds no room waits for one to be given back.

How many reads fit: a read after a full one (a backlog of large events) asks
for its whole share, and as many go as the budget holds whole; the others (a
new tick, mostly a few small events) split what is free evenly, but none gets
less than ``MIN_READ_BOUND`` or the largest event seen in recent reads, since a
read always takes at least one event and a bound below its size is passed. A
share larger than the whole budget is cut to it. So the budget is passed only
by events larger than their read's bound: one each, in their own read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import asyncpg

from pgferry.delivery.model import utf8_length

#: The least bound a read of a crowded statement gets: 1,000 subscriptions reading one tick
#: at once share a 64 MB budget at 64 KB each, in ONE statement (Stepper.MAX_STEPS is 1,000).
MIN_READ_BOUND = 64 << 10
#: Answered reads (statements, retry rounds) whose largest events set the least bound (module doc).
RECENT_READS = 64
#: The default budget: with the 64 MB of the relay itself and each byte read held up to three
#: times (the events, their request bodies, the bytes on their way to the socket), a relay's
#: memory stays under 256 MB whatever the backlog (docs/operations.md, "Relay memory").
DEFAULT_MAX_READ_BYTES = 64 << 20
#: Waiters kept before the cancelled ones among them are dropped (then twice those left)
PURGE_AT = 64


class ReadBudget:
    """Bytes read and not yet delivered (held) or asked for by a read under way (reserved)."""

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"the read budget must be positive, got {total}")
        self.total = total
        #: bytes held and reserved now
        self.used = 0
        #: the most ``used`` has been (tests, benchmarks)
        self.peak = 0
        self._largest: deque[int] = deque(maxlen=RECENT_READS)
        #: (bytes it needs free, its future, whether it is handed them): woken in turn, once what
        #: it needs is free, so that a thousand waiting reads do not all wake on every release
        self._waiters: list[tuple[int, asyncio.Future[None], bool]] = []
        #: the least any waiter needs (no waking below it), and the length that purges the done
        self._least_need = 0
        self._purge_at = PURGE_AT

    @property
    def free(self) -> int:
        return self.total - self.used

    def admit(self, reads: int, share: int, *, whole: bool = False) -> tuple[int, int]:
        """For a statement of ``reads`` reads of up to ``share`` bytes each (at most the budget):
        how many may go now and the bound each gets, reserved (``admitted * bound`` bytes, see
        ``settle``); (0, 0) when none fits. ``whole``: each needs its whole share (a backlog)."""
        share = min(share, self.total)
        least = share if whole else self.least(share)
        admitted = min(reads, max(self.free, 0) // least)
        if not admitted:
            return 0, 0
        bound = min(share, self.free // admitted)
        self._take(admitted * bound)
        return admitted, bound

    def least(self, share: int) -> int:
        """The least bound a read gets (of at most ``share``): MIN_READ_BOUND, or the largest
        event of recent reads when larger (a read takes at least one event)."""
        return min(share, self.total, max(MIN_READ_BOUND, max(self._largest, default=0)))

    def settle(self, reserved: int, held: int, largest: int = 0) -> None:
        """A statement answered: of its ``reserved`` bytes its reads hold ``held`` (what they
        returned; ``largest``: its largest event), until each is released."""
        if largest:
            self._largest.append(largest)
        self._take(held - reserved)

    def settle_rows(self, reserved: int, reads: Sequence[Sequence[asyncpg.Record]]) -> list[int]:
        """A statement answered, with ``reads`` (each read's rows, with payload and headers as
        text): of its ``reserved`` bytes, each read holds its events' bytes (``held_bytes``; a row
        without an event, none) until it is released. Returns what each read holds."""
        held: list[int] = []
        largest = 0
        for rows in reads:
            sizes = [held_bytes(r["payload"], r["headers"]) for r in rows]
            held.append(sum(sizes))
            largest = max(largest, *sizes, 0)
        self.settle(reserved, sum(held), largest)
        return held

    def release(self, held: int) -> None:
        """A read's events are delivered: its bytes are free again."""
        if held:
            self._take(-held)

    def waiter(self, need: int) -> asyncio.Future[None]:
        """A future done when bytes are given back and ``need`` of them are free (for waiting on
        it and something else; cancel it when done waiting)."""
        return self._wait(need, handed=False)

    async def acquire(self, share: int, *, whole: bool = False) -> int:
        """One read's bound (reserved), once it fits: the retry loop's reads. It is the least
        bound unless ``whole`` (the reader's last read filled its bound: a backlog), not all that
        is free up to ``share``: after an endpoint's pause a thousand retry loops read at once,
        and reads of 4 MB each let 16 go at a time. A read that waits is handed its bytes, in
        turn, as they are given back: woken all at once to race for them, 5,000 retry loops of a
        relay starting up spent its CPU waking and waiting again."""
        need = min(share if whole else self.least(share), self.total)
        admitted, bound = self.admit(1, need, whole=True)
        if admitted:
            return bound
        waiter = self._wait(need, handed=True)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed its bytes as it was cancelled
                self.release(need)
            raise
        return need

    def _wait(self, need: int, *, handed: bool) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if len(self._waiters) >= self._purge_at:  # cancelled ones, while too little was ever free
            self._waiters = [w for w in self._waiters if not w[1].done()]
            self._purge_at = max(PURGE_AT, 2 * len(self._waiters))
        self._least_need = min(self._least_need, need) if self._waiters else need
        self._waiters.append((need, waiter, handed))
        return waiter

    def _take(self, n: int) -> None:
        self._count(n)
        if n < 0 and self._waiters and self.free >= self._least_need:
            # In turn, while what they need is free: the acquire()s are handed their bytes (they
            # are theirs once woken), the Stepper's drain loops only woken (they take what fits
            # when they run, or wait again: a few at most, and none keeps bytes from the rest).
            waiting: list[tuple[int, asyncio.Future[None], bool]] = []
            for need, waiter, handed in self._waiters:
                if waiter.done():
                    continue
                if need <= self.free:
                    if handed:
                        self._count(need)
                    waiter.set_result(None)
                else:
                    waiting.append((need, waiter, handed))
            self._waiters = waiting
            self._least_need = min((need for need, _, _ in waiting), default=0)

    def _count(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)


def held_bytes(payload: str | None, headers: str | None) -> int:
    """What one event read counts against the budget: its payload and headers in bytes of
    their text (octet_length, the measure ferry.webhook_steps bounds reads by)."""
    return utf8_length(payload or "") + utf8_length(headers or "")
