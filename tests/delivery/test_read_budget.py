"""The relay's read budget on its own (delivery/budget.py): who may read, with what bound, and when."""

from __future__ import annotations

import asyncio

import pytest

from pgferry.delivery.budget import MIN_READ_BOUND, ReadBudget
from pgferry.relay.process import RelaySettings

MB = 1 << 20


def test_a_crowd_of_reads_shares_what_is_free_and_a_backlog_read_asks_for_its_whole_share() -> None:
    budget = ReadBudget(64 * MB)
    # 1,000 reads of a new tick: all in one statement, 64 KB each.
    assert budget.admit(1000, 5 * MB) == (1000, 64 * MB // 1000)
    budget.settle(1000 * (64 * MB // 1000), held=1000 * 100)  # they read 100 bytes each
    assert budget.used == 100_000
    # Reads after a backlog's full read: each gets its whole share, as many as fit.
    assert budget.admit(20, 5 * MB, whole=True) == (12, 5 * MB)
    assert budget.admit(1, 5 * MB, whole=True) == (0, 0)
    assert budget.used == 100_000 + 60 * MB <= budget.peak == 1000 * (64 * MB // 1000)


def test_reads_no_longer_split_below_the_largest_event_seen_and_a_share_is_at_most_the_budget() -> None:
    budget = ReadBudget(8 * MB)
    budget.settle(0, held=0, largest=2 * MB)  # a read returned a 2 MB event
    assert budget.admit(10, 5 * MB) == (4, 2 * MB)
    budget.release(8 * MB)
    small = ReadBudget(1 * MB)
    assert small.admit(1, 5 * MB, whole=True) == (1, 1 * MB)  # cut to the budget, not past it
    assert ReadBudget(10 * MB).admit(1000, 5 * MB)[1] >= MIN_READ_BOUND


async def test_a_read_with_no_room_waits_until_bytes_are_given_back() -> None:
    budget = ReadBudget(4 * MB)
    assert budget.admit(1, 4 * MB, whole=True) == (1, 4 * MB)
    budget.settle(4 * MB, held=3 * MB)  # the read returned 3 MB, held until delivered
    assert await budget.acquire(4 * MB) == 1 * MB  # a retry round reads what is free
    budget.settle(1 * MB, held=1 * MB)
    waiting = asyncio.ensure_future(budget.acquire(4 * MB))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    budget.release(3 * MB)
    assert await asyncio.wait_for(waiting, 1) == 3 * MB
    assert budget.used == 4 * MB and budget.peak == 4 * MB


def test_a_relay_refuses_a_read_budget_too_small_to_read_with() -> None:
    with pytest.raises(ValueError, match="max_read_bytes must be at least 65536 bytes"):
        RelaySettings(max_read_bytes=1000)
