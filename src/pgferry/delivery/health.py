"""Endpoint health: an endpoint that is down is probed, not hammered, and gets its backlog at once when it is back.

Without this, every event parked during an outage followed its own
exponential backoff: a receiver down for 60 s while 20,000 events were
written still had 3 of them waiting 304 s after it came back, and while it
was down every due event cost it a request. Now the relay keeps, per
endpoint (scheme, host, port), a count of endpoint-level failures in a row:
refused or timed-out connections, resets, empty or garbled answers, and the
statuses that speak for the whole endpoint (429, 502, 503, 504). After
``down_after`` of them the endpoint is down: its events are held (parked
without spending an attempt), its idle kept-alive connections are dropped
(a partition or a restarted server can leave them dead without a word), and
one request at a time, on a new connection, at most one per
``probe_interval`` (longer if the endpoint asked with Retry-After), goes out
as a probe; a failed probe does not use up the attempts of the event it
carries (``retry.judge``). The first answer that is not an endpoint-level failure (a 2xx,
but also a 400 or a 500: the endpoint is up, the event is the problem) makes
it healthy again and tells every worker delivering to it to release its
parked events now (ordered subscriptions still send each key in order).

A plain 500 does not count toward "down": a receiver that rejects some
events must not have its healthy traffic held behind them.

A 429 speaks for one URL, not for its host: rate limits are often per URL
(one webhook of a chat service), and one subscription's 429s held every
other subscription to the same host:port for up to a minute (outside
probe); so does a JetStream publish left unacknowledged on a standing
connection (OWN_ERRORS). A worker's key is its endpoint and its
subscription (``Scoped``): such failures count toward that subscription
alone, which is then held and probed the same way; everything else counts
for the host:port.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pgferry.delivery.http import HttpResult, host_port

log = logging.getLogger(__name__)

Endpoint = tuple[str, str, int]
#: an endpoint and a subscription delivering to it: the key of failures that speak for one URL
Scoped = tuple[str, str, int, str]
Key = Endpoint | Scoped

#: Endpoint-level failures in a row that mark an endpoint down.
DOWN_AFTER = 5
#: Seconds between probes of a down endpoint (docs/reliability.md: the outage timeline).
PROBE_INTERVAL = 1.0
#: The longest a Retry-After on a probe's answer delays the next probe.
MAX_PROBE_DELAY = 60.0
#: Error classes that say nothing answered for the endpoint.
ENDPOINT_ERRORS = frozenset(("connect", "timeout", "empty_reply", "reset", "dns", "tls", "invalid_response"))
#: Statuses that speak for the whole endpoint, not for one event.
ENDPOINT_STATUSES = frozenset((429, 502, 503, 504))
#: ... of which these speak for one URL (a subscription's), when the key has one.
URL_STATUSES = frozenset((429,))
#: Failures that speak for a subscription, when the key has one, by scheme: a JetStream publish
#: that gets no acknowledgement while the connection stands says as much about its subject (no
#: stream captures it but a subscriber that answers nothing; a permission the user lacks) as about
#: the server. One subscription's marked the server down and held the others (outside probe).
OWN_ERRORS = frozenset((("nats", "timeout"),))


class Admission(enum.Enum):
    SEND = "send"  # healthy: send
    PROBE = "probe"  # down, and this request is the probe
    HOLD = "hold"  # down: do not send


def endpoint_failure(result: HttpResult) -> bool:
    """Whether ``result`` says the endpoint (not the event) is failing."""
    return result.error_class in ENDPOINT_ERRORS or result.status in ENDPOINT_STATUSES


@dataclass
class _State:
    failures: int = 0
    down_since: datetime | None = None
    next_probe: float = 0.0
    probing: bool = False
    #: the task that was admitted the probe: if it ends without reporting (cancelled by a pause,
    #: a stop, a lost database), the probe is over, or the endpoint stayed "down" for good
    probe_owner: asyncio.Task[object] | None = None
    last_error: str | None = None
    #: called when the endpoint answers again
    on_recovery: set[Callable[[], None]] = field(default_factory=set)


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (pure tests)
        return None


class EndpointHealth:
    """The health of every endpoint one relay delivers to; shared by its workers. Keys are an
    endpoint, or an endpoint and a subscription (``Scoped``: its 429s and OWN_ERRORS count for it
    alone)."""

    def __init__(
        self,
        *,
        down_after: int = DOWN_AFTER,
        probe_interval: float = PROBE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if down_after < 1 or probe_interval <= 0:
            raise ValueError("down_after must be at least 1 and probe_interval positive")
        self.down_after = down_after
        self.probe_interval = probe_interval
        self.clock = clock
        self._states: dict[Key, _State] = {}

    def _state(self, key: Key) -> _State:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _State()
        return state

    def _keys(self, key: Key) -> list[Key]:
        """The host's key, and the subscription's when ``key`` has one."""
        return [key[:3], key] if len(key) == 4 else [key]

    def _down(self, key: Key) -> tuple[Key, _State] | None:
        """The state that holds ``key``'s events: the host's first, then the subscription's."""
        for k in self._keys(key):
            state = self._states.get(k)
            if state is not None and state.down_since is not None:
                return k, state
        return None

    def watch(self, key: Key, on_recovery: Callable[[], None]) -> None:
        for k in self._keys(key):
            self._state(k).on_recovery.add(on_recovery)

    def unwatch(self, key: Key, on_recovery: Callable[[], None]) -> None:
        for k in self._keys(key):
            state = self._states.get(k)
            if state is not None:
                state.on_recovery.discard(on_recovery)

    def host_down(self, key: Key) -> bool:
        """Whether ``key``'s host (not only its subscription) is down: its probes take a new
        connection (one probing for a subscription alone must not close the one others share)."""
        state = self._states.get(key[:3])
        return state is not None and state.down_since is not None

    def is_down(self, key: Key) -> bool:
        return self._down(key) is not None

    def down_since(self, key: Key) -> datetime | None:
        down = self._down(key)
        return down[1].down_since if down is not None else None

    def down_note(self, key: Key) -> str:
        """Why events of ``key`` are held (for their parked rows and `pgferry trace`)."""
        down = self._down(key)
        state = down[1] if down is not None else self._state(key[:3])
        since = f"{state.down_since:%Y-%m-%d %H:%M:%S}Z" if state.down_since else "?"
        what = "endpoint down" if down is None or len(down[0]) == 3 else "the endpoint fails this subscription"
        return (f"held: {what} since {since} (last error: {state.last_error or '?'}); "
                "sent once a probe gets an answer")  # fmt: skip

    def probe_wait(self, key: Key) -> float | None:
        """None when the endpoint is healthy; else seconds until a probe may go (0: now)."""
        down = self._down(key)
        if down is None:
            return None
        state = down[1]
        if self._probing(state):
            return self.probe_interval
        return max(0.0, state.next_probe - self.clock())

    def admit(self, key: Key) -> Admission:
        down = self._down(key)
        if down is None:
            return Admission.SEND
        state = down[1]
        if self._probing(state) or self.clock() < state.next_probe:
            return Admission.HOLD
        state.probing = True
        state.probe_owner = _current_task()
        return Admission.PROBE

    @staticmethod
    def _probing(state: _State) -> bool:
        """Whether a probe is out; one whose task ended without a word is not."""
        if state.probing and state.probe_owner is not None and state.probe_owner.done():
            state.probing = False
            state.probe_owner = None
        return state.probing

    def report(self, key: Key, result: HttpResult, admission: Admission) -> bool:
        """What the request admitted as ``admission`` ended with; True when this made the
        endpoint down (its kept-alive connections are then suspect: drop them)."""
        states = [(k, self._state(k)) for k in self._keys(key)]
        if admission is Admission.PROBE:
            for _, state in states:
                state.probing = False
                state.probe_owner = None
        if result.error_class == "withdrawn":  # never sent: says nothing
            if admission is Admission.PROBE:
                for _, state in states:
                    state.next_probe = self.clock()
            return False
        own = len(key) == 4 and (result.status in URL_STATUSES or (key[0], result.error_class) in OWN_ERRORS)
        answered = not endpoint_failure(result) or (own and result.status in URL_STATUSES)
        if answered:  # the host is up; so is the subscription, unless this is its own failure
            for k, state in states[:1] if own else states:
                state.failures = 0
                if state.down_since is not None:
                    self._recovered(k, state)
            if not own:
                return False
        k, state = states[-1] if own else states[0]
        state.failures += 1
        state.last_error = result.error or result.error_class
        if state.down_since is None:
            if state.failures >= self.down_after:
                state.down_since = datetime.now(UTC)
                state.next_probe = self.clock() + self.probe_interval
                log.warning(
                    "%s is down after %d failures in a row (last: %s); holding its events, a due one "
                    "probing it at most every %g s",
                    _name(k), state.failures, state.last_error, self.probe_interval,
                )  # fmt: skip
                return not own
            return False
        if admission is Admission.PROBE:
            delay = max(self.probe_interval, min(result.retry_after or 0.0, MAX_PROBE_DELAY))
            state.next_probe = self.clock() + delay
        return False

    def _recovered(self, key: Key, state: _State) -> None:
        down_for = (datetime.now(UTC) - state.down_since).total_seconds() if state.down_since else 0.0
        log.info("%s answers again after %.1f s down; releasing its held events", _name(key), down_for)
        state.down_since = None
        state.probing = False
        state.probe_owner = None
        for callback in list(state.on_recovery):
            callback()


def _name(key: Key) -> str:
    """How the log names a key (never a URL's path: it may hold a token)."""
    endpoint = f"endpoint {key[0]}://{host_port(key[1], key[2])}"
    return endpoint if len(key) == 3 else f"{endpoint} for subscription {key[3]}"
