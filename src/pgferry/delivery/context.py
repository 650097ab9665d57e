"""What every subscription worker of a relay shares, and what became of each event it sent.

Kept apart from ``delivery.worker`` so that sinks, the metrics and the relay's
surface can name these without importing the engine that uses them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import asyncpg

from pgferry.delivery.brokers import Brokers
from pgferry.delivery.budget import DEFAULT_MAX_READ_BYTES, ReadBudget
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.health import EndpointHealth
from pgferry.delivery.http import HttpResult
from pgferry.delivery.in_flight import RelayInFlight
from pgferry.delivery.model import OutEvent
from pgferry.delivery.steps import Stepper

#: Batches in flight at once: one being sent while the next is read. A third
#: made batch-100 throughput ~10% higher (60K vs 54K events/s) but the
#: single-row p99 worse (median of runs 56 vs 37 ms): batches queue behind
#: each other for the in-flight slots (docs/benchmarks.md).
PIPELINE_DEPTH = 2
#: Bytes of event payloads (and headers) a worker's reads hold at once: each read, of its up to
#: PIPELINE_DEPTH batches and one retry round, is bounded to an equal share. A backlog of
#: ~600 KB events took the relay to 1,274 MB without it (docs/benchmarks.md, "Memory").
DEFAULT_MAX_BATCH_BYTES = 16 << 20
#: The largest bound one read takes (ferry.webhook_steps' max_bytes is an integer).
MAX_READ_BYTES = (1 << 31) - 1


class InFlight:
    """The outcome of an event whose request was still unanswered when its batch was recorded."""


IN_FLIGHT = InFlight()


@dataclass(frozen=True, slots=True)
class Held:
    """The outcome of an event not sent because its endpoint is down (``note`` says since when)."""

    note: str
    ok = False


# None: not sent (waiting behind an earlier event of its key, or not on the wire when the batch let go)
Outcome = tuple[OutEvent, HttpResult | Held | InFlight | None]


@dataclass
class DeliveryContext:
    """What every worker of a relay shares."""

    pool: asyncpg.Pool
    http: FastSender  # webhook POSTs and pg_net requests
    #: the relay's max_in_flight, shared fairly among the subscriptions sending (delivery.in_flight)
    global_limit: RelayInFlight
    #: connections to message brokers (NATS JetStream and Redis sinks)
    brokers: Brokers = field(default_factory=Brokers)
    max_body_bytes: int = 1 << 20
    #: this install's name in the broker sinks' duplicate checks (ferry.config.instance, migration
    #: 0034); "" where none is known (a sink made in a test)
    instance: str = ""
    max_batch_events: int | None = None
    #: what a subscription's reads hold at once (DEFAULT_MAX_BATCH_BYTES); None: unbounded
    max_batch_bytes: int | None = DEFAULT_MAX_BATCH_BYTES
    #: what every subscription's reads hold at once, together (delivery.budget); None: no relay-wide bound
    max_read_bytes: int | None = DEFAULT_MAX_READ_BYTES
    retry_fetch: int = 1000
    poll_interval: float = 1.0
    #: seconds a batch waits without any answer before letting go of its requests in flight (delivery.sending)
    detach_after: float = 1.0
    #: metrics hook: (subscription, outcomes, from a log batch?) after each round
    observe: Callable[[str, Sequence[Outcome], bool], None] | None = None
    #: metrics hook: (subscription, requests) taken back before they reached the wire because
    #: their round let go of slow requests while they waited for a connection (their events
    #: are sent later; a duplicate here would mean one was counted as in flight and sent twice)
    observe_withdrawn: Callable[[str, int], None] | None = None
    health: EndpointHealth = field(default_factory=EndpointHealth)
    #: every worker's acknowledgements and reads, many subscriptions per statement
    steps: Stepper = field(init=False)
    #: bytes read and not yet delivered, over every worker (None: no budget)
    budget: ReadBudget | None = field(init=False)
    #: set by a worker that went idle holding acknowledgements: the LogWatch records them soon
    acks_waiting: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.max_batch_bytes is not None and self.max_batch_bytes < PIPELINE_DEPTH + 1:
            raise ValueError(f"max_batch_bytes must be at least {PIPELINE_DEPTH + 1}, got {self.max_batch_bytes}")
        # No read budget without a byte bound on each read (what a read reserves is its bound):
        # without max_batch_bytes there is none (the Stepper and the retry loop take it as given).
        budget = self.max_read_bytes if self.read_bytes is not None else None
        self.budget = ReadBudget(budget) if budget is not None else None
        self.steps = Stepper(self.pool, self.max_batch_events, self.read_bytes, self.budget)

    @property
    def read_bytes(self) -> int | None:
        """The byte bound of one read: a share of max_batch_bytes, so that what a worker holds
        at once (PIPELINE_DEPTH batches and a retry round) stays within it."""
        if self.max_batch_bytes is None:
            return None
        return min(self.max_batch_bytes // (PIPELINE_DEPTH + 1), MAX_READ_BYTES)
