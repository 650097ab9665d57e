"""Sending one subscription's events through its sink: rounds of requests, within the
subscription's ``max_in_flight`` and the relay's limit, per-key lanes when ``ordered``, the
endpoint's health (held while down, one probe at a time), and letting go of slow requests.

A round that waits ``detach_after`` for an answer and gets none lets go of the requests it
has in flight: their events are reported as in flight (parked until their timeout), the rest
as answered or not sent, and the worker moves on; the answer to a request let go of is handed
to ``answered_late`` once the round's parking is committed (``Round.recorded``). A round that
is still getting answers goes on: a batch of 50 requests takes longer than a second on busy
cores without any request being slow, and letting go of it parked up to 4,900 events at a
time, each copied into ferry.retries and recorded again when its answer came (15 times in one
`bench sinks` run into JetStream). Only a request that reached the wire can be in flight: one
still waiting for a connection is withdrawn, never sent.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgferry.delivery.context import IN_FLIGHT, DeliveryContext, Held, Outcome
from pgferry.delivery.health import Admission, Key
from pgferry.delivery.http import HttpResult
from pgferry.delivery.in_flight import SubscriptionInFlight
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.sink import Sink

log = logging.getLogger(__name__)

#: A chunk that fails so is sent again as two halves, until the events at fault go alone: too
#: large as a whole, or refused by a broker for one of its events (a Redis stream key holding
#: another type failed every event of its chunk, on other keys too: outside probe).
SPLIT_ON = frozenset({"too_large", "rejected"})

#: What the worker does with the answer to a request its round let go of: (the round's
#: ``recorded`` event, the chunk, the answer).
AnsweredLate = Callable[[asyncio.Event, Sequence[OutEvent], HttpResult], Coroutine[Any, Any, None]]


@dataclass
class Round:
    """The requests of one delivery round, so that the round can let go of slow ones."""

    outcomes: list[Outcome] = field(default_factory=list)
    #: chunks whose requests reached the wire and are unanswered, by id() of the chunk
    in_flight: dict[int, Sequence[OutEvent]] = field(default_factory=dict)
    let_go: bool = False
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    #: the endpoint admission the round already holds (its probe), else None: asked per request
    admission: Admission | None = None


class Sender:
    """The sending side of one subscription's worker."""

    def __init__(
        self,
        sub: Subscription,
        sink: Sink,
        ctx: DeliveryContext,
        probes: set[int],
        answered_late: AnsweredLate,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.sub = sub
        #: set when the worker stops: no request starts after it (those in flight finish)
        self.stopping = stopping or asyncio.Event()
        self.sink = sink
        self.ctx = ctx
        #: events sent as probes of a down endpoint (the bookkeeper judges their answers by the probe rule)
        self.probes = probes
        self.answered_late = answered_late
        #: the endpoint whose health gates the requests (None: not followed, as for pg_net)
        self.endpoint: Key | None = None
        self.limit = SubscriptionInFlight(sub.max_in_flight, ctx.global_limit)
        #: events in requests in flight now
        self.in_flight = 0
        #: requests let go of by their round, and the recording of their answers
        self.background: set[asyncio.Future[Any]] = set()
        #: events parked as in flight whose answers are not recorded yet
        self.let_go: set[int] = set()

    def follow(self, sub: Subscription, sink: Sink) -> None:
        """New settings: they take effect with the next request."""
        if sub.max_in_flight != self.sub.max_in_flight:
            self.limit = SubscriptionInFlight(sub.max_in_flight, self.ctx.global_limit)
        self.sub, self.sink = sub, sink

    async def send(
        self, chunk: Sequence[OutEvent], on_wire: Callable[[], bool] | None = None, admission: Admission | None = None
    ) -> HttpResult | Held:
        sub, sink = self.sub, self.sink
        prepared = sink.prepare(chunk)
        if isinstance(prepared, HttpResult):
            return prepared
        endpoint = self.endpoint
        if endpoint is None:
            admission = Admission.SEND
        elif admission is None:
            admission = self.ctx.health.admit(endpoint)
            if admission is Admission.HOLD:
                return Held(self.ctx.health.down_note(endpoint))
        if admission is Admission.PROBE:
            self.probes.update(e.id for e in chunk)
        gate = on_wire
        held = False
        if endpoint is not None and admission is Admission.SEND:

            def gate() -> bool:  # the endpoint may have gone down while this waited for a slot
                nonlocal held
                if self.ctx.health.is_down(endpoint):
                    held = True
                    return False
                return on_wire() if on_wire is not None else True

        # The subscription's limit (its max_in_flight and its share of the relay's) covers the
        # batch and the retry loop together.
        async with self.limit, self.ctx.global_limit:
            self.in_flight += len(chunk)
            try:
                fresh = admission is Admission.PROBE and endpoint is not None and self.ctx.health.host_down(endpoint)
                result = await sink.send(chunk, prepared, gate, fresh=fresh)
            except Exception as exc:  # a bug of ours must cost a retry, not the worker
                log.exception("subscription %s: unexpected error sending events %s", sub.name, [e.id for e in chunk])
                result = HttpResult(None, "internal", f"pgferry internal error: {exc!r}", None, 0.0)
            finally:
                self.in_flight -= len(chunk)
        if result.error_class == "withdrawn":
            if admission is Admission.PROBE:
                self.probes.difference_update(e.id for e in chunk)  # never sent: nothing to judge
            if not held and self.ctx.observe_withdrawn is not None:  # its round let go meanwhile
                self.ctx.observe_withdrawn(sub.name, 1)
        if endpoint is not None:
            if held:
                return Held(self.ctx.health.down_note(endpoint))
            if self.ctx.health.report(endpoint, result, admission):
                sink.endpoint_down()
        return result

    async def deliver(
        self, events: Sequence[OutEvent], blocked: set[str], probe: bool = False
    ) -> tuple[list[Outcome], asyncio.Event | None]:
        """Sends ``events``; returns their outcomes, and (when the round let go of slow
        requests) the event to set once those outcomes are committed."""
        sending = Round(admission=Admission.PROBE if probe else None)
        work = asyncio.ensure_future(self._send_all(events, blocked, sending))
        patience = self.ctx.detach_after if self.sink.may_let_go(self.ctx.detach_after) else None
        answered = 0
        try:
            while True:
                await asyncio.wait({work}, timeout=patience)
                if work.done() or not sending.in_flight:
                    await work
                    return self._with_unsent(events, sending.outcomes), None
                if len(sending.outcomes) == answered:
                    break  # nothing answered for a whole patience: let go
                answered = len(sending.outcomes)
        except BaseException:
            work.cancel()
            raise
        # Let go: what was answered counts, requests in flight are parked as in flight,
        # events not sent yet are parked as due now; the round's tasks stop after their
        # current request, whose answer _answered_late records.
        sending.let_go = True
        self.background.add(work)
        work.add_done_callback(self.background.discard)
        in_flight = {e.id for chunk in sending.in_flight.values() for e in chunk}
        self.let_go |= in_flight
        settled = {e.id for e, _ in sending.outcomes}
        outcomes = list(sending.outcomes)
        for e in events:
            if e.id in in_flight:
                outcomes.append((e, IN_FLIGHT))
            elif e.id not in settled:
                outcomes.append((e, None))
        log.info(
            "subscription %s: %d event(s) in requests unanswered after %.1f s; moving on, their answers are "
            "recorded when they come", self.sub.name, len(in_flight), patience,
        )  # fmt: skip
        return outcomes, sending.recorded

    def _with_unsent(self, events: Sequence[OutEvent], outcomes: list[Outcome]) -> list[Outcome]:
        """``outcomes``, and the events the round did not send because the worker stopped: not sent
        (parked, due now, for whoever delivers the subscription next). A stopping worker went on
        sending its whole batch (5,000 requests at max_in_flight 4), was cancelled when its grace
        ran out, and everything it had delivered was sent again by the next owner: 176 of 437 events
        twice after one SIGTERM, and a relay restarted on a backlog never moved on (outside probe)."""
        if len(outcomes) == len(events):
            return outcomes
        settled = {e.id for e, _ in outcomes}
        return outcomes + [(e, None) for e in events if e.id not in settled]

    async def _send_all(self, events: Sequence[OutEvent], blocked: set[str], sending: Round) -> None:
        sub = self.sub
        batch_size = self.sink.batch_size
        if not sub.ordered:
            if 0 < len(events) <= batch_size:  # one request: no task of its own
                await self._send_in(sending, events)
                return
            chunks = deque(events[i : i + batch_size] for i in range(0, len(events), batch_size))

            async def drain() -> None:
                while chunks and not sending.let_go and not self.stopping.is_set():
                    await self._send_in(sending, chunks.popleft())

            await asyncio.gather(*(drain() for _ in range(min(sub.max_in_flight, len(chunks)))))
            return

        n_lanes = max(1, min(sub.max_in_flight, len(events)))
        lanes: list[list[OutEvent]] = [[] for _ in range(n_lanes)]
        for e in events:
            lane = zlib.crc32(e.key.encode()) if e.key is not None else e.id
            lanes[lane % n_lanes].append(e)

        async def run_lane(lane_events: list[OutEvent]) -> None:
            chunk: list[OutEvent] = []

            async def flush() -> None:
                result = await self._send_in(sending, list(chunk))
                if result is not None and not result.ok:
                    blocked.update(e.key for e in chunk if e.key is not None)
                chunk.clear()

            for e in lane_events:
                if sending.let_go or self.stopping.is_set():
                    return
                if e.key is not None and e.key in blocked:
                    sending.outcomes.append((e, None))
                    continue
                chunk.append(e)
                if len(chunk) >= batch_size:
                    await flush()
            if chunk and not sending.let_go and not self.stopping.is_set():
                await flush()

        await asyncio.gather(*(run_lane(lane) for lane in lanes if lane))

    async def _send_in(self, sending: Round, chunk: Sequence[OutEvent]) -> HttpResult | Held | None:
        """Sends ``chunk`` as part of ``sending``; None when the round let go of it meanwhile."""
        key = id(chunk)

        def on_wire() -> bool:  # the last moment a request can be taken back
            if sending.let_go:
                return False
            sending.in_flight[key] = chunk
            return True

        try:
            result = await self.send(chunk, on_wire, sending.admission)
        finally:
            wired = sending.in_flight.pop(key, None) is not None
        if isinstance(result, HttpResult) and result.error_class in SPLIT_ON and len(chunk) > 1:
            return await self._send_halves(sending, chunk)
        if sending.let_go:
            # Its events were parked when the round let go: as in flight if the request was
            # on the wire (its answer is recorded now), as due now if it was not.
            if wired and isinstance(result, HttpResult):
                task = asyncio.create_task(self.answered_late(sending.recorded, chunk, result))
                self.background.add(task)
                task.add_done_callback(self.background.discard)
            return None
        sending.outcomes.extend((e, result) for e in chunk)
        return result

    async def _send_halves(self, sending: Round, chunk: Sequence[OutEvent]) -> HttpResult | Held | None:
        """A chunk that fails as a whole (SPLIT_ON) goes as two, each split again while it fails
        so, so that only the events at fault fail (a batch of 100 events of 15 KB each went to dead
        letters whole, over the 1 MB limit, though each one fit). With ``ordered``, the second
        half's events of a key the first half failed to deliver wait behind it."""
        half = len(chunk) // 2
        first = await self._send_in(sending, chunk[:half])
        rest = list(chunk[half:])
        failed = not (isinstance(first, HttpResult) and first.ok)
        if self.sub.ordered and failed:
            keys = {e.key for e in chunk[:half] if e.key is not None}
            sending.outcomes.extend((e, None) for e in rest if e.key in keys)
            rest = [e for e in rest if e.key not in keys]
        second = await self._send_in(sending, rest) if rest else None
        return first if failed else second
