"""pgferry.aio.Slots: the relay's semaphore for requests in flight (and each endpoint's
connections). Property test: any interleaving of tasks arriving, releasing and being cancelled
(while waiting, just after being handed a slot, or while holding one) never has more holders
than slots, hands slots out in arrival order, and loses none."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pgferry.aio import Slots, Wake

ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 0)),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("cancel"), st.integers(0, 5)),
        st.tuples(st.just("yield"), st.integers(1, 2)),
        st.tuples(st.just("settle"), st.integers(0, 0)),
    ),
    max_size=60,
)


@settings(max_examples=500, deadline=None)
@given(size=st.integers(1, 3), script=ops)
# the race hypothesis rarely draws: the waiter is cancelled just after a release handed it the slot
@example(size=1, script=[("arrive", 0), ("arrive", 0), ("yield", 1), ("release", 0), ("yield", 1), ("cancel", 1)])
# a task arriving at a slot freed just after another was handed to a waiter starts first (a CI run)
@example(
    size=2, script=[("arrive", 0)] * 3 + [("yield", 1), ("release", 0), ("release", 1), ("arrive", 0), ("settle", 0)]
)
def test_never_more_holders_than_slots_in_arrival_order_none_lost(size: int, script: list[tuple[str, int]]) -> None:
    async def run() -> None:
        slots = Slots(size)
        holding: set[int] = set()
        handed: list[int] = []
        done: list[asyncio.Event] = []
        tasks: list[asyncio.Task[None]] = []

        async def holder(n: int) -> None:
            # A free slot now: acquire takes it at once, and no earlier arrival may still wait
            # for one (a release hands its slot to the first waiter before counting it free).
            fast = not slots.locked()
            if fast:
                assert all(w.done() for w in slots._waiters), "a slot free while a task waits"
            async with slots:
                holding.add(n)
                if not fast:  # handed a slot by a release: in turn
                    handed.append(n)
                assert len(holding) <= size
                try:
                    await done[n].wait()
                finally:
                    holding.discard(n)

        for op, arg in script:
            if op == "arrive":
                done.append(asyncio.Event())
                tasks.append(asyncio.create_task(holder(len(tasks))))
            elif op == "release" and tasks:
                done[arg % len(tasks)].set()
            elif op == "cancel" and tasks:
                tasks[arg % len(tasks)].cancel()
            elif op == "yield":
                for _ in range(arg):
                    await asyncio.sleep(0)
            elif op == "settle":  # once every woken task has run, a task waits only if every slot is held
                for _ in range(10):
                    await asyncio.sleep(0)
                waiting = [n for n, t in enumerate(tasks) if not t.done() and n not in holding]
                assert not waiting or len(holding) == size

        # Handed out in arrival order. (Not the order holders start: a task arriving at a free
        # slot may start before a waiter handed another slot has run.)
        assert handed == sorted(handed), "slots handed out in arrival order"
        for event in done:
            event.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not holding
        # none lost: every slot is free again, at once
        for _ in range(size):
            await asyncio.wait_for(slots.acquire(), 1)
        assert slots.locked()

    asyncio.run(run())


async def test_a_waiter_cancelled_after_it_was_handed_a_slot_passes_it_on() -> None:
    slots = Slots(1)
    await slots.acquire()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to first, which has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the slot went on
    assert slots.locked()


def test_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        Slots(-1)


async def test_wake_ends_a_wait_by_its_flag_or_by_the_future_beside_it_and_keeps_no_callback() -> None:
    wake = Wake()
    loop = asyncio.get_running_loop()
    for _ in range(100):  # each wait ended by its future: nothing of it stays with the flag
        head: asyncio.Future[None] = loop.create_future()
        waiting = asyncio.create_task(wake.wait(head))
        await asyncio.sleep(0)
        head.set_result(None)
        await asyncio.wait_for(waiting, 1)
    assert not wake._callbacks and not wake.is_set()
    head = loop.create_future()
    waiting = asyncio.create_task(wake.wait(head))
    await asyncio.sleep(0)
    assert not waiting.done()
    wake.set()
    await asyncio.wait_for(waiting, 1)
    await asyncio.wait_for(wake.wait(), 1)  # set: at once
    wake.clear()
    waiting = asyncio.create_task(wake.wait())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not wake._callbacks


async def test_a_wait_ended_without_a_cancel_loses_no_slot() -> None:
    """A coroutine closed (or thrown into) while it waits is not handed the next slot."""
    slots = Slots(1)
    await slots.acquire()
    waiting = slots.acquire()
    waiting.send(None)  # runs up to its wait
    waiting.close()
    slots.release()
    await asyncio.wait_for(slots.acquire(), 1)
