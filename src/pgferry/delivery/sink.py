"""One interface for every destination the engine delivers to.

The worker (``delivery.worker``) owns everything a destination should not
care about: reading the log, batching, ``max_in_flight``, per-key lanes,
letting go of slow requests, endpoint health, retries, parking, dead letters
and the bookkeeping transaction. A sink only turns a chunk of events into
what its destination takes and reports how that went, as an ``HttpResult``
(the name is historical: a broker's answer has no status, only an error
class and a text, which is all retries, ``trace`` and metrics read).

Implementations: webhooks (``delivery.webhook``), the pg_net API
(``delivery.pg_net``), NATS JetStream (``delivery.jetstream``) and Redis
Streams (``delivery.redis_streams``); which one a subscription gets follows
from its kind and its URL's scheme (``delivery.worker.sink_for``).

What a Kafka sink (aiokafka) would need, written down because no broker can
run here to test one: ``prepare`` renders each event's topic, key (the
event key, so Kafka's partitioner keeps per-key order) and headers;
``send`` calls ``send_and_wait``-style produce for the chunk on an
idempotent producer (``enable_idempotence``, ``acks=all``), and maps
``KafkaTimeoutError``/``NotLeaderForPartition`` to endpoint-level classes
(``timeout``, ``connect``) and ``MessageSizeTooLarge`` to ``too_large``.
The idempotent producer only deduplicates within one producer session, so
exactly-once across a relay's crash would need a transactional producer
(``transactional_id`` per subscription unit) or consumers deduplicating by
the ``webhook-id`` header, which every sink sends.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pgferry.delivery.health import Endpoint
from pgferry.delivery.http import HttpResult
from pgferry.delivery.model import OutEvent, Subscription

if TYPE_CHECKING:
    from pgferry.delivery.context import DeliveryContext

#: What a sink's prepare() hands to its send(): anything it likes.
Prepared = Any


class Sink(abc.ABC):
    """How a subscription's events reach its destination."""

    def __init__(self, sub: Subscription, ctx: DeliveryContext) -> None:
        self.sub = sub
        self.ctx = ctx

    @property
    def endpoint(self) -> Endpoint | None:
        """The endpoint whose health gates this sink's sends (``delivery.health``), or None."""
        return None

    @property
    def batch_size(self) -> int:
        """Events per send."""
        return self.sub.batch_size

    def may_let_go(self, detach_after: float) -> bool:
        """Whether a round may stop waiting for a slow send after ``detach_after`` seconds."""
        return self.sub.timeout_ms / 1000 > detach_after

    async def ready(self, events: Sequence[OutEvent]) -> Sequence[OutEvent]:
        """The events of a log batch still to be sent (all of them, unless the sink knows better)."""
        return events

    def prepare(self, chunk: Sequence[OutEvent]) -> Prepared | HttpResult:
        """What ``send`` sends for ``chunk``, or the result of a chunk that cannot be sent at all
        (no retry can fix it: ``bad_request``, ``too_large``)."""
        return chunk

    @abc.abstractmethod
    async def send(
        self, chunk: Sequence[OutEvent], prepared: Prepared, on_wire: Callable[[], bool] | None, *, fresh: bool
    ) -> HttpResult:
        """Sends one chunk. ``on_wire`` is asked right before anything leaves: if it answers
        False nothing is sent and the result's error class is ``withdrawn``. ``fresh``: on a new
        connection (a probe of an endpoint that was down)."""

    def delivered(self, result: HttpResult) -> bool:
        """Whether ``result`` ends the event's delivery as delivered."""
        return result.ok

    def gone(self, result: HttpResult) -> str | None:
        """Why ``result`` says the destination is gone for good (the subscription is disabled), or None."""
        return None

    def response_row(self, event: OutEvent, result: HttpResult) -> tuple[Any, ...] | None:
        """A row to record for an event whose delivery ended (the pg_net API's responses)."""
        return None

    def endpoint_down(self) -> None:
        """The endpoint was just marked down: drop connections that may be dead without a word."""
        return None
