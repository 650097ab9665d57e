"""RollingCounter against the plain sum it replaces: any adds, at any times, any window asked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pgferry.delivery.counters import RollingCounter


@given(
    adds=st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 20)), max_size=60),
    asks=st.lists(st.tuples(st.integers(0, 5), st.sampled_from([1, 5, 30, 60, 300, 600])), max_size=10),
)
def test_counts_what_a_plain_sum_over_the_window_counts(
    adds: list[tuple[int, int]], asks: list[tuple[int, int]]
) -> None:
    counter = RollingCounter(window=60)
    seen: list[tuple[int, int]] = []
    now = 1_000_000
    for step, n in adds:  # time only moves on
        now += step
        counter.add(n, now=now)
        if n > 0:
            seen.append((now, n))
    for step, seconds in asks:
        now += step
        expected = sum(c for s, c in seen if s > now - min(seconds, 60))
        assert counter.last(seconds, now=now) == expected
    assert counter.total == sum(c for _, c in seen)
