"""The relay's read budget (delivery/budget.py): who may read, with what bound, and when; and the
Stepper's reads (delivery/steps.py) giving back what they hold."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from pgferry import db
from pgferry.delivery.budget import MIN_READ_BOUND, ReadBudget
from pgferry.delivery.context import DeliveryContext
from pgferry.delivery.model import consumer_name
from pgferry.delivery.steps import Step
from pgferry.relay.process import RelaySettings
from tests.helpers import tick

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


async def test_retry_reads_take_the_least_bound_unless_their_last_one_filled_its_bound() -> None:
    budget = ReadBudget(64 * MB)
    # An endpoint's pause over: a hundred retry loops read at once, side by side.
    bounds = await asyncio.wait_for(asyncio.gather(*(budget.acquire(4 * MB) for _ in range(100))), 1)
    assert set(bounds) == {MIN_READ_BOUND} and budget.used == 100 * MIN_READ_BOUND
    assert await budget.acquire(4 * MB, whole=True) == 4 * MB  # a backlog of large parked events
    budget.settle(0, held=0, largest=1 * MB)
    assert await budget.acquire(4 * MB) == 1 * MB  # never below the largest event seen


async def test_a_read_with_no_room_waits_until_bytes_are_given_back() -> None:
    budget = ReadBudget(4 * MB)
    assert budget.admit(1, 4 * MB, whole=True) == (1, 4 * MB)
    budget.settle(4 * MB, held=3 * MB)  # the read returned 3 MB, held until delivered
    assert await budget.acquire(4 * MB) == MIN_READ_BOUND  # what is free is enough for the least
    waiting = asyncio.ensure_future(budget.acquire(4 * MB, whole=True))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    budget.release(MIN_READ_BOUND)
    await asyncio.sleep(0.01)
    assert not waiting.done()  # its whole share is not free yet
    budget.release(3 * MB)
    assert await asyncio.wait_for(waiting, 1) == 4 * MB
    assert budget.used == 4 * MB and budget.peak == 4 * MB


async def test_a_waiting_read_wakes_only_once_what_it_needs_is_free() -> None:
    budget = ReadBudget(4 * MB)
    budget.settle(0, held=4 * MB)  # every byte held
    whole, small = budget.waiter(2 * MB), budget.waiter(MIN_READ_BOUND)
    budget.release(1 * MB)
    assert small.done() and not whole.done()
    budget.release(1 * MB)
    assert whole.done()
    # Waiters given up on (the Stepper's, when a step joins) are dropped while nothing frees.
    budget.settle(0, held=2 * MB)
    for _ in range(1000):
        budget.waiter(1 * MB).cancel()
    assert len(budget._waiters) <= 128


async def test_waiting_retry_reads_are_handed_what_is_given_back_in_turn_not_woken_all_at_once() -> None:
    budget = ReadBudget(64 * MB)
    budget.settle(0, held=64 * MB)  # every byte held
    waiting = [asyncio.ensure_future(budget.acquire(4 * MB)) for _ in range(1000)]
    await asyncio.sleep(0.01)
    budget.release(10 * MIN_READ_BOUND)
    await asyncio.sleep(0.01)
    assert [w.done() for w in waiting] == [True] * 10 + [False] * 990  # in the order they came
    assert budget.used == 64 * MB
    waiting[10].cancel()  # a read cancelled while it waits takes nothing ...
    budget.release(MIN_READ_BOUND)
    await asyncio.sleep(0.01)
    assert waiting[11].done() and not waiting[12].done()
    assert budget.used == 64 * MB
    budget.release(64 * MB - 11 * MIN_READ_BOUND)  # ... and all is given back: the rest fit
    await asyncio.wait_for(asyncio.gather(*waiting[11:]), 1)
    assert budget.used == 999 * MIN_READ_BOUND  # every read but the cancelled one holds its bound


def test_a_relay_refuses_a_read_budget_too_small_to_read_with() -> None:
    with pytest.raises(ValueError, match="max_read_bytes must be at least 65536 bytes"):
        RelaySettings(max_read_bytes=1000)


async def test_a_read_holds_its_events_bytes_in_the_budget_not_their_characters(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await conn.execute("select ferry.subscribe('s', array['s'], 'http://127.0.0.1:9/')")
    for text in ["ascii", "é" * 1000, "漢字" * 500, "🚢" * 250]:
        await conn.execute("select ferry.publish('s', jsonb_build_object('p', $1::text), null, '{\"h\": \"ü\"}')", text)
    await tick(conn)
    octets, chars = await conn.fetchrow(
        """select sum(octet_length(payload::text) + octet_length(headers::text)),
                  sum(length(payload::text) + length(headers::text)) from ferry.events"""
    )
    pool = await db.create_pool(db_url, max_size=2)
    try:
        ctx = DeliveryContext(pool=pool, http=None, global_limit=None)  # type: ignore[arg-type]
        assert ctx.budget is not None
        step = Step("s", consumer_name("s"), None, False, None, True, None)
        rows = await ctx.steps.step(step)
        assert len([r for r in rows if r["id"] is not None]) == 4
        assert step.held == ctx.budget.used == octets == chars + 1000 + 2 * 1000 + 3 * 250 + 4
    finally:
        await pool.close()


async def test_a_read_whose_worker_is_cancelled_once_it_is_answered_gives_its_bytes_back(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await conn.execute("select ferry.subscribe('s', array['s'], 'http://127.0.0.1:9/')")
    await conn.execute("select ferry.publish_many(array['s', 's', 's'], array_fill('{\"p\": 1}'::jsonb, array[3]))")
    await tick(conn)
    pool = await db.create_pool(db_url, max_size=2)
    try:
        ctx = DeliveryContext(pool=pool, http=None, global_limit=None)  # type: ignore[arg-type]
        assert ctx.budget is not None
        step = Step("s", consumer_name("s"), None, False, None, True, None)
        worker = asyncio.create_task(ctx.steps.step(step))
        # Called before the worker's own wake-up: its owner stops it (run()'s finally cancels its
        # loops) after the read's result is set and before the worker takes its events off.
        step.result.add_done_callback(lambda _: worker.cancel())
        with pytest.raises(asyncio.CancelledError):
            await worker
        assert len([r for r in step.result.result() if r["id"] is not None]) == 3  # the read was answered
        assert ctx.budget.peak > 0
        assert ctx.budget.used == 0, "the read's bytes are given back"
    finally:
        await pool.close()
