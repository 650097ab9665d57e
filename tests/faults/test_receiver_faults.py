"""Receivers that misbehave under load: slow, hanging, garbage, closing after the headers,
dropping connections, redirecting in a loop; for a while, and for good."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg
import pytest

from pgferry.receiver import Action, CutBody, Drop, Garbage, Hang, Received, Respond, Slow
from tests.faults.conftest import Load, settle
from tests.helpers import MakeReceiver, RunningRelay, eventually, redirect_to_self

SUBSCRIBE = """select ferry.subscribe('hook', array['s'], $1, timeout_ms => $2, max_attempts => $3,
                                     retry_base_ms => 50, retry_max_ms => 400, max_in_flight => 16)"""


def for_a_while(bad: Callable[[Received], Action], seconds: float) -> Callable[[Received], Action]:
    """Misbehave with ``bad`` for ``seconds`` from the first request on, then answer 200."""
    started: list[float] = []

    def behave(request: Received) -> Action:
        if not started:
            started.append(time.monotonic())
        return bad(request) if time.monotonic() - started[0] < seconds else Respond()

    return behave


CASES: dict[str, Callable[[Received], Action]] = {
    "hanging": lambda _: Hang(),
    "slower than the timeout": lambda _: Slow(1.5),
    "garbage": lambda _: Garbage(),
    "closing after headers": lambda _: CutBody(body_bytes=0),
    "closing mid-body": lambda _: CutBody(body_bytes=10),
    "dropping connections": lambda _: Drop(),
    "redirect loop": redirect_to_self,
    "503 with Retry-After": lambda _: Respond(503, b"busy", (("retry-after", "1"),)),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_receiver_misbehaving_for_a_while_loses_nothing(
    case: str, db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory(for_a_while(CASES[case], 2.0))
    await conn.execute(SUBSCRIBE, url, 1000, 20)
    relay = RunningRelay(db_url)
    load = Load(db_url, per_round=10, interval=0.05).start()
    try:
        await asyncio.sleep(3.0)
        await load.stop()
        tally = await settle(conn, [receiver], acked=load.acked, timeout=30)
        failed = await conn.fetchval(
            "select count(*) from ferry.attempt_history()"
            " where error_class is not null or status not between 200 and 299"
        )
    finally:
        await load.stop()
        await relay.stop()
    print(f"receiver {case} for 2 s: {tally}, failed attempts {failed}")
    assert tally.committed > 200 and not tally.lost and tally.dead == 0
    assert failed > 0  # the fault really happened and was recorded


async def test_slow_receiver_within_the_timeout_gets_everything_once(
    db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory(lambda _: Slow(1.0))
    await conn.execute(SUBSCRIBE, url, 5000, 20)
    relay = RunningRelay(db_url)
    started = time.monotonic()
    try:
        ids = await conn.fetch("select ferry.publish('s', jsonb_build_object('seq', n)) from generate_series(1, 64) n")
        tally = await settle(conn, [receiver], acked=[r[0] for r in ids], timeout=30)
    finally:
        await relay.stop()
    took = time.monotonic() - started
    print(f"receiver taking 1 s per request, 16 in flight: {tally}, {took:.1f} s for 64 events")
    assert tally.committed == 64 and not tally.lost and tally.duplicates == 0 and tally.dead == 0
    assert took < 12  # requests overlap (16 in flight), not 64 s one after another


@pytest.mark.parametrize(
    ("case", "error_class", "endpoint_down"),
    [("hanging", "timeout", True), ("redirect loop", "redirect", False), ("garbage", "invalid_response", True)],
)
async def test_receiver_broken_for_good_ends_in_dead_letters(
    case: str, error_class: str, endpoint_down: bool, db_url: str, conn: asyncpg.Connection,
    receiver_factory: MakeReceiver,
) -> None:  # fmt: skip
    """An answer that is not HTTP, or none at all, says the endpoint is down: its events are held
    (no attempts spent, one probe a second) until max_age; a redirect is an answer, per event."""
    receiver, url = await receiver_factory(CASES[case])
    await conn.execute(SUBSCRIBE.replace(")", ", max_age => '3 seconds')"), url, 300, 3)
    relay = RunningRelay(db_url)
    try:
        ids = await conn.fetch("select ferry.publish('s', jsonb_build_object('seq', n)) from generate_series(1, 50) n")
        tally = await settle(conn, [receiver], acked=[r[0] for r in ids], timeout=30)

        async def all_dead() -> bool:
            return await conn.fetchval("select count(*) from ferry.dead_letters") == 50  # type: ignore[no-any-return]

        await eventually(all_dead, timeout=10, what="50 dead letters")
        classes = await conn.fetch(
            "select distinct a.error_class from ferry.attempt_history() a join ferry.dead_letters d using (event_id)"
        )
        explained = await conn.fetchval("select count(*) from ferry.dead_letters where last_error <> ''")
        exhausted = await conn.fetchval("select count(*) from ferry.dead_letters where attempts = 3")
    finally:
        await relay.stop()
    print(f"receiver {case} for good: {tally}, {receiver.stats.requests} requests, {exhausted} with 3 attempts")
    assert tally.committed == 50 and tally.dead == 50 and tally.delivered == 0 and not tally.lost
    assert {r[0] for r in classes} == {error_class} and explained == 50
    if endpoint_down:  # 16 in flight when it went down, then about a probe a second
        assert receiver.stats.requests < 50, receiver.stats.requests
    else:
        assert exhausted == 50 and receiver.stats.requests == 150
