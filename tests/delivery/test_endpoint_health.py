"""An endpoint that is down is probed, not hammered; when it answers again its backlog goes at once."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

import pgferry
from pgferry.delivery.health import Admission, EndpointHealth
from pgferry.delivery.http import HttpResult
from pgferry.ops.inspect import subscription_status
from pgferry.receiver import Action, CutBody, Received, Receiver, Respond
from tests.helpers import RunningRelay, eventually

EP = ("http", "hooks.example", 80)


def result(status: int | None = None, error_class: str | None = None, retry_after: float | None = None) -> HttpResult:
    return HttpResult(status, error_class, error_class and f"{error_class}!", None, 1.0, retry_after)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_five_endpoint_failures_in_a_row_mark_it_down_and_one_probe_a_second_goes_out() -> None:
    clock = Clock()
    health = EndpointHealth(clock=clock)
    recovered: list[str] = []
    health.watch(EP, lambda: recovered.append("yes"))
    for failure in (result(error_class="connect"), result(503, "http_status"), result(error_class="timeout")) * 2:
        assert health.admit(EP) is Admission.SEND
        health.report(EP, failure, Admission.SEND)
        if health.is_down(EP):
            break
    assert health.is_down(EP) and "(last error: http_status!)" in health.down_note(EP)
    assert health.admit(EP) is Admission.HOLD and health.probe_wait(EP) == pytest.approx(1.0)
    clock.now += 1.0
    assert health.admit(EP) is Admission.PROBE
    assert health.admit(EP) is Admission.HOLD  # one probe at a time
    health.report(EP, result(error_class="connect"), Admission.PROBE)
    assert health.admit(EP) is Admission.HOLD and health.probe_wait(EP) == pytest.approx(1.0)
    clock.now += 1.0
    assert health.admit(EP) is Admission.PROBE
    health.report(EP, result(429, "http_status", retry_after=7), Admission.PROBE)  # Retry-After spaces probes
    assert health.probe_wait(EP) == pytest.approx(7.0)
    clock.now += 7.0
    assert health.admit(EP) is Admission.PROBE
    health.report(EP, result(200), Admission.PROBE)
    assert not health.is_down(EP) and health.admit(EP) is Admission.SEND and recovered == ["yes"]


def test_answers_about_one_event_do_not_mark_an_endpoint_down() -> None:
    health = EndpointHealth()
    for answer in [result(500, "http_status"), result(400, "http_status"), result(error_class="redirect")] * 5:
        health.report(EP, answer, Admission.SEND)
    assert not health.is_down(EP)
    for _ in range(4):
        health.report(EP, result(error_class="reset"), Admission.SEND)
    health.report(EP, result(200), Admission.SEND)  # a success in between starts the count again
    for _ in range(4):
        health.report(EP, result(error_class="reset"), Admission.SEND)
    assert not health.is_down(EP)


def test_a_withdrawn_probe_gives_its_turn_back() -> None:
    clock = Clock()
    health = EndpointHealth(down_after=1, clock=clock)
    health.report(EP, result(error_class="connect"), Admission.SEND)
    clock.now += 1
    assert health.admit(EP) is Admission.PROBE
    health.report(EP, result(error_class="withdrawn"), Admission.PROBE)
    assert health.admit(EP) is Admission.PROBE and health.is_down(EP)


async def test_a_probe_whose_task_ended_without_a_word_is_over() -> None:
    """A worker paused (cancelled) mid-probe never reported it: the endpoint stayed down, for every
    subscription to it, until the relay restarted."""
    clock = Clock()
    health = EndpointHealth(down_after=1, clock=clock)
    health.report(EP, result(error_class="connect"), Admission.SEND)
    clock.now += 1

    async def probe_then_hang() -> None:
        assert health.admit(EP) is Admission.PROBE
        await asyncio.sleep(3600)  # the probe's request, never answered

    prober = asyncio.create_task(probe_then_hang())
    await asyncio.sleep(0)
    assert health.admit(EP) is Admission.HOLD  # one probe at a time, while it lives
    prober.cancel()
    with pytest.raises(asyncio.CancelledError):
        await prober
    assert health.probe_wait(EP) == 0.0 and health.admit(EP) is Admission.PROBE


class Outage:
    """Answers 503 while down, 200 after; counts requests in each phase."""

    def __init__(self) -> None:
        self.down = True
        self.while_down = 0
        self.back_at: float | None = None
        self.first_ok_at: float | None = None
        #: (path, event id) of every request answered 200, in order
        self.ok: list[tuple[str, int]] = []

    def __call__(self, request: Received) -> Action:
        if self.down:
            self.while_down += 1
            return Respond(503, b"maintenance")
        if self.first_ok_at is None:
            self.first_ok_at = time.monotonic()
        self.ok.append((request.path, int(request.headers["webhook-id"].removeprefix("evt_"))))
        return Respond()


async def test_a_backlog_built_during_an_outage_is_delivered_within_seconds_of_the_first_successful_probe(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    outage = Outage()
    receiver = Receiver(outage)
    url = await receiver.start()
    try:
        # Two attempts each: a probe of a down endpoint does not use up the attempts of the event it
        # carries (a long outage would otherwise dead-letter whatever the probes carried).
        await ferry.subscribe("plain", ["s"], f"{url}/plain", max_in_flight=32, max_attempts=2)
        await ferry.subscribe("ordered", ["s"], f"{url}/ordered", ordered=True, max_in_flight=32, max_attempts=2)
        started = time.monotonic()
        for _ in range(4):  # 2,000 events over about 3 s of outage
            await conn.execute(
                "select ferry.publish('s', jsonb_build_object('n', g), key => 'k' || (g % 10))"
                " from generate_series(1, 500) g"
            )
            await eventually(lambda: _parked_at_least(conn, 1), what="the relay parking events")
        await _sleep_until(started + 3.0)

        async def reported_down() -> bool:  # what `pgferry status` shows, from the relay's heartbeat
            return all(r["health"].startswith("down for") for r in await subscription_status(conn))

        await eventually(reported_down, what="status showing the endpoint down")
        down_for = time.monotonic() - started
        requests_while_down = outage.while_down
        outage.down = False
        outage.back_at = time.monotonic()

        async def all_arrived() -> bool:
            return len(set(outage.ok)) >= 4000

        await eventually(all_arrived, timeout=30, what="4,000 deliveries after the outage")
        assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
        drained_at = time.monotonic()
        assert outage.first_ok_at is not None
        drained = drained_at - outage.first_ok_at
    finally:
        await receiver.stop()
    print(f"{requests_while_down} requests in {down_for:.1f} s down; backlog of 4,000 drained "
          f"{drained:.1f} s after the first successful probe")  # fmt: skip
    # two subscriptions x (32 in flight when it went down + a probe a second); not 4,000 x backoff
    assert requests_while_down < 2 * (32 + 5 + 2 * down_for), requests_while_down
    assert drained < 10
    assert len(outage.ok) == 4000, "each event answered 200 once"
    keys = {r.headers["webhook-id"]: r.headers["pgferry-key"] for r in receiver.received}
    by_key: dict[str, list[int]] = {}
    for path, event_id in outage.ok:
        if path.endswith("/ordered"):
            by_key.setdefault(keys[f"evt_{event_id}"], []).append(event_id)
    assert len(by_key) == 10 and all(ids == sorted(ids) for ids in by_key.values()), "key order kept"


async def _parked_at_least(conn: asyncpg.Connection, n: int) -> bool:
    return bool(await conn.fetchval("select count(*) from ferry.retries") >= n)


async def _sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))


class RefusesOnceWhenBack(Outage):
    """Down (503), then answers each event 413 once and 200 after."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[str] = set()

    def __call__(self, request: Received) -> Action:
        if not self.down and request.headers["webhook-id"] not in self.refused:
            self.refused.add(request.headers["webhook-id"])
            return Respond(413, b"too large today")
        return super().__call__(request)


async def test_failed_probes_spend_none_of_an_event_s_attempts(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """max_attempts 3: one failure before the endpoint was marked down, probes while down, then
    one 413 from the endpoint back up. The probes' failures were counted, and after a 10 s outage
    9 events of 10 were dead-lettered by that one 413 (outside probe)."""
    endpoint = RefusesOnceWhenBack()
    receiver = Receiver(endpoint)
    url = await receiver.start()
    try:
        await ferry.subscribe("p", ["s"], f"{url}/p", max_attempts=3, retry_base_ms=50, retry_max_ms=200)
        await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(1, 10) g")
        await eventually(lambda: endpoint.while_down >= 10 + 5 + 4, what="probes while down")
        endpoint.down = False

        async def all_arrived() -> bool:
            return len(endpoint.ok) >= 10

        await eventually(all_arrived, timeout=30, what="10 deliveries after the outage")
    finally:
        await receiver.stop()
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0
    probes = await conn.fetchval(
        "select count(*) from ferry.attempts where error like '%not counted against max_attempts'"
    )
    assert probes >= 4, probes  # recorded, and said so


async def test_the_one_event_a_down_endpoint_holds_is_probed_ever_less_often(
    relay: RunningRelay, ferry: pgferry.Ferry
) -> None:
    """A receiver that took every request but answered unreadably (a 200 cut short here; a 200
    with oversized headers in the outside probe) was marked down, and the one event it held went
    as a probe every second, each time stored again: 609 copies in 17 minutes. A failed probe
    now doubles its event's wait (about as long as it has been failing)."""
    arrivals: list[float] = []

    def cut_short(_: Received) -> CutBody:
        arrivals.append(time.monotonic())
        return CutBody(10)

    receiver = Receiver(cut_short)
    url = await receiver.start()
    try:
        await ferry.subscribe("p", ["s"], f"{url}/p", retry_base_ms=50, retry_max_ms=60_000)
        await ferry.publish("s", {"n": 1})
        await eventually(lambda: len(arrivals) >= 5, what="five failures: the endpoint down")
        down_at = time.monotonic()
        await asyncio.sleep(8)
    finally:
        await receiver.stop()
    probes = [t for t in arrivals if t > down_at]
    assert 1 <= len(probes) <= 4, f"{len(probes)} probes of one event in 8 s (one a second before)"


def test_a_subscription_s_429s_hold_it_alone_and_its_host_s_other_subscriptions_go_on() -> None:
    """A 429 speaks for one URL: one subscription's 429s held every other subscription to the
    same host:port for up to a minute (outside probe). Its own events are held and probed."""
    clock = Clock()
    health = EndpointHealth(clock=clock)
    limited, other = (*EP, "tenant-a"), (*EP, "tenant-b")
    for _ in range(5):
        assert health.admit(limited) is Admission.SEND
        health.report(limited, result(429, "http_status", retry_after=30), Admission.SEND)
    assert health.is_down(limited) and not health.is_down(other) and not health.is_down(EP)
    assert health.admit(other) is Admission.SEND
    assert "the endpoint fails this subscription" in health.down_note(limited)
    clock.now += 1.0
    assert health.admit(limited) is Admission.PROBE
    health.report(limited, result(429, "http_status", retry_after=30), Admission.PROBE)
    assert health.probe_wait(limited) == 30.0  # the probe's Retry-After
    # The host going down holds everyone, the limited one too; its answer frees both.
    for _ in range(5):
        health.report(other, result(None, "connect"), Admission.SEND)
    assert health.is_down(other) and health.is_down(EP)
    clock.now += 31.0
    assert health.admit(other) is Admission.PROBE
    health.report(other, result(200), Admission.PROBE)
    assert not health.is_down(other) and health.is_down(limited)  # its 429s are its own
    assert health.admit(limited) is Admission.PROBE
    health.report(limited, result(200), Admission.PROBE)
    assert not health.is_down(limited)


async def test_a_rate_limited_subscription_does_not_hold_another_on_the_same_host(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """One path answers 429 (Retry-After 30), another 200, on one host:port: a burst of 20 events
    to both reaches the second at once (it waited 49 s at the median; outside probe)."""

    refused = 0

    def answer(request: Received) -> Action:
        nonlocal refused
        if request.path.endswith("/limited"):
            refused += 1
            return Respond(429, b"slow down", (("Retry-After", "30"),))
        return Respond()

    receiver = Receiver(answer)
    url = await receiver.start()
    try:
        await ferry.subscribe("limited", ["s"], f"{url}/limited")
        await ferry.subscribe("fine", ["s"], f"{url}/fine")
        await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(1, 20) g")
        await eventually(lambda: refused >= 5, what="429s")
        await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(21, 40) g")

        async def fine_has_all() -> bool:
            return len({r.headers["webhook-id"] for r in receiver.received if r.path.endswith("/fine")}) == 40

        await eventually(fine_has_all, timeout=8, what="all 40 events at /fine")
        status = {r["name"]: r["health"] for r in await subscription_status(conn)}
    finally:
        await receiver.stop()
    assert status["fine"] == "ok" or not status["fine"].startswith("down"), status
