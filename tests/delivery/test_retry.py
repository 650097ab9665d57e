"""What follows a failed attempt (pure: no database, no network)."""

from __future__ import annotations

import random
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from pgferry.delivery.http import HttpResult
from pgferry.delivery.retry import backoff, judge
from tests.helpers import NOW, subscription

SUB = subscription()
DOWN = HttpResult(None, "connect", "refused", None, 1.0)


def test_a_failed_probe_does_not_use_up_attempts_but_max_age_still_ends_it() -> None:
    exhausted = SUB.max_attempts
    assert judge(SUB, DOWN, exhausted, NOW, NOW).dead
    assert not judge(SUB, DOWN, exhausted + 50, NOW, NOW, probe=True).dead
    assert judge(SUB, DOWN, 1, NOW - SUB.max_age - timedelta(seconds=1), NOW, probe=True).dead
    assert judge(SUB, HttpResult(None, "bad_request", "x", None, 0.0), 1, NOW, NOW, probe=True).dead  # permanent


@given(failing_for=st.integers(min_value=0, max_value=10**7), seed=st.integers(min_value=0))
def test_a_failed_probe_waits_about_as_long_as_its_event_has_been_failing(failing_for: int, seed: int) -> None:
    random.seed(seed)
    age = timedelta(seconds=failing_for)
    verdict = judge(SUB, DOWN, 1, NOW - age, NOW, probe=True)
    if age >= SUB.max_age:
        assert verdict.dead
        return
    assert verdict.next_attempt_at is not None
    wait = verdict.next_attempt_at - NOW
    waited = min(age, timedelta(milliseconds=SUB.retry_max_ms))
    assert waited / 2 <= wait
    assert wait <= max(waited, timedelta(milliseconds=SUB.retry_base_ms))
    # an attempt that is not a probe keeps its own backoff
    plain = judge(SUB, DOWN, 1, NOW - age, NOW).next_attempt_at
    assert plain is None or plain - NOW <= timedelta(milliseconds=SUB.retry_base_ms)


@given(attempts=st.integers(min_value=1, max_value=100), seed=st.integers(min_value=0))
def test_backoff_is_between_half_the_step_and_the_step(attempts: int, seed: int) -> None:
    """The floor makes max_attempts a time the operator can count on: with full jitter, 20
    attempts at retry_max_ms 400 once ran out in under 2 s instead of ~3.4 s."""
    step = min(SUB.retry_max_ms, SUB.retry_base_ms * 2 ** (attempts - 1))
    delay = backoff(SUB, attempts, random.Random(seed)) / timedelta(milliseconds=1)
    assert step / 2 <= delay <= step
