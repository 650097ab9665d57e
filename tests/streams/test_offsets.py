"""Offsets and commit ticks (pure: no database)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgferry.log.ticks import Snapshot, commit_ticks
from pgferry.streams.offsets import BadOffset, Offset


def test_an_offset_reads_back_from_its_text_and_bad_texts_say_what_offsets_look_like() -> None:
    assert Offset.parse(str(Offset(12, 345))) == Offset(12, 345)
    assert Offset(3, 9) < Offset(4, 1) < Offset(4, 2)
    for bad in ["", "12", "12-", "-3", "a-b", "1-2-3", "1 - 2", "9" * 19 + "-1", "1-2\n"]:
        with pytest.raises(BadOffset, match="is not a stream offset"):
            Offset.parse(bad)


def test_a_snapshot_sees_what_committed_before_it() -> None:
    snapshot = Snapshot.parse("100:105:101,103")
    assert [t for t in range(98, 107) if snapshot.sees(t)] == [98, 99, 100, 102, 104]


def test_the_commit_tick_is_the_first_tick_that_sees_the_transaction() -> None:
    ticks = [(10, Snapshot.parse("100:105:101,103")), (11, Snapshot.parse("103:108:103,106")),
             (12, Snapshot.parse("106:110:106")), (13, Snapshot.parse("110:110:"))]  # fmt: skip
    assert commit_ticks([101, 102, 103, 105, 106, 107, 109, 111], ticks) == [11, 10, 12, 11, 13, 11, 12, None]


@st.composite
def tick_histories(draw: st.DrawFn) -> list[tuple[int, Snapshot]]:
    """Snapshots as PostgreSQL takes them: transactions 0..n-1 start in order and commit in any
    order; each tick sees those committed so far (xmax: the next transaction to start)."""
    n = draw(st.integers(1, 40))
    commit_order = draw(st.permutations(list(range(n))))
    started_by = sorted(draw(st.lists(st.integers(0, n), min_size=n, max_size=n)))  # starts before each commit
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=1, max_size=12)))
    ticks = []
    for number, done in enumerate(cuts, start=1):
        committed = set(commit_order[:done])
        started = max([started_by[done - 1] if done else 0, *(t + 1 for t in committed)])
        running = frozenset(t for t in range(started) if t not in committed)
        ticks.append((number, Snapshot(min(running, default=started), started, running)))
    return ticks


@given(tick_histories())
def test_commit_ticks_agree_with_testing_every_tick_in_turn(ticks: list[tuple[int, Snapshot]]) -> None:
    txids = list(range(max(s.xmax for _, s in ticks) + 2))
    expected = [next((tick for tick, s in ticks if s.sees(t)), None) for t in txids]
    assert commit_ticks(txids, ticks) == expected
