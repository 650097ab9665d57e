"""What happens after a failed attempt: retry later (when), or give up."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import Subscription

#: Failures that another attempt cannot fix.
#: (``no_ack``: a JetStream stream that never acknowledges; each retry might store the event again.)
PERMANENT = {"bad_request", "too_large", "refused_address", "no_ack"}
#: The longest we honour a Retry-After header.
MAX_RETRY_AFTER = timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class Verdict:
    dead: bool
    next_attempt_at: datetime | None


def backoff(sub: Subscription, attempts: int, rng: random.Random | None = None) -> timedelta:
    """Exponential backoff with equal jitter: uniform in [step / 2, step], where
    step = min(retry_max_ms, retry_base_ms * 2^(n-1)).

    Not full jitter (uniform in [0, step]): with it the time an event's
    max_attempts span was a matter of luck. At retry_max_ms 400 and 20
    attempts, one event in a few hundred used them all up in under 2 s
    instead of the ~3.4 s expected, and went to dead letters during an outage
    its schedule was meant to ride out. Half the step is still enough jitter
    to spread retries that failed together; the floor makes the schedule's
    length a promise: at least half the sum of the steps."""
    step = min(sub.retry_max_ms, sub.retry_base_ms * 2 ** min(attempts - 1, 40))
    return timedelta(milliseconds=(rng or random).uniform(step / 2, step))


def judge(
    sub: Subscription, result: HttpResult, attempts: int, first_failed_at: datetime, now: datetime,
    *, probe: bool = False,
) -> Verdict:  # fmt: skip
    """``attempts`` counts the attempt that just failed. ``probe``: the request was the relay
    asking a down endpoint whether it is back; its failure says nothing about the event, so it
    does not use up max_attempts (max_age still applies). Otherwise a long outage would
    dead-letter whatever events the probes happened to carry (a key's first parked event, for
    an ordered subscription).

    A failed probe's event still waits longer each time: at least about as long as it has been
    failing (so each probe it carries doubles its age), up to retry_max_ms. With its attempts
    not counted, its backoff stayed at that of its last counted attempt, and a receiver that
    took every request but answered it unreadably (a 2xx with oversized headers, or after the
    timeout) got the one event it was held on again every second: 609 copies in 17 minutes, and
    so on for max_age (outside probe). Probes go on at probe_interval while other events are due."""
    if result.error_class in PERMANENT:
        return Verdict(dead=True, next_attempt_at=None)
    age = now - first_failed_at
    if (attempts >= sub.max_attempts and not probe) or age >= sub.max_age:
        return Verdict(dead=True, next_attempt_at=None)
    delay = backoff(sub, attempts)
    if probe:
        waited = min(age, timedelta(milliseconds=sub.retry_max_ms))
        delay = max(delay, waited * random.uniform(0.5, 1.0))
    if result.retry_after is not None:
        # Capped before it becomes a timedelta: Retry-After: 100000000000000 overflowed it, and the
        # worker failed on every answer without recording one.
        delay = max(delay, timedelta(seconds=min(result.retry_after, MAX_RETRY_AFTER.total_seconds())))
    return Verdict(dead=False, next_attempt_at=now + delay)
