"""What follows a failed attempt (pure: no database, no network)."""

from __future__ import annotations

from datetime import timedelta

from pgferry.delivery.http import HttpResult
from pgferry.delivery.retry import judge
from tests.helpers import NOW, subscription

SUB = subscription()
DOWN = HttpResult(None, "connect", "refused", None, 1.0)


def test_a_failed_probe_does_not_use_up_attempts_but_max_age_still_ends_it() -> None:
    exhausted = SUB.max_attempts
    assert judge(SUB, DOWN, exhausted, NOW, NOW).dead
    assert not judge(SUB, DOWN, exhausted + 50, NOW, NOW, probe=True).dead
    assert judge(SUB, DOWN, 1, NOW - SUB.max_age - timedelta(seconds=1), NOW, probe=True).dead
    assert judge(SUB, HttpResult(None, "bad_request", "x", None, 0.0), 1, NOW, NOW, probe=True).dead  # permanent
