"""The sender's answer attribution end to end: a real relay delivering two subscriptions
to one host:port, whose server sends ``100 Continue`` before every final answer."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

import pgferry
from tests.delivery.conformance.scripted import CONTINUE, MakeScripted, Pause, Request, Step, full, requested_status
from tests.helpers import RunningRelay, eventually

EVENTS = 10


def continue_then_answer(request: Request) -> Sequence[Step]:
    return [CONTINUE, Pause(0.005), full(requested_status(request))]


async def test_each_subscription_s_attempts_record_the_status_the_server_gave_its_own_requests(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, scripted: MakeScripted
) -> None:
    server = await scripted(continue_then_answer)
    for name, status in (("fails", 500), ("works", 200)):  # max_attempts 1: a failure goes straight to dead letters
        await conn.execute(
            "select ferry.subscribe($1, array['s'], $2, max_attempts => 1)", name, server.url(f"/answer/{status}")
        )
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(EVENTS)])

    async def settled() -> bool:
        attempts = await conn.fetchval("select count(*) from ferry.attempt_history()")
        letters = await conn.fetchval("select count(*) from ferry.dead_letters")
        return bool(attempts >= 2 * EVENTS and letters >= EVENTS)

    await eventually(settled, timeout=20, what=f"{2 * EVENTS} attempts and {EVENTS} dead letters")
    asked = sorted(requested_status(r) for r in server.requests)
    assert asked == [200] * EVENTS + [500] * EVENTS, "each event was sent once per subscription"
    attempts = await conn.fetch(
        "select subscription, status, error_class, count(*) as n from ferry.attempt_history()"
        " group by 1, 2, 3 order by 1, 2"
    )
    recorded = [tuple(a) for a in attempts]
    assert recorded == [("fails", 500, "http_status", EVENTS), ("works", 200, None, EVENTS)], recorded
    letters = await conn.fetch("select subscription, event_id, last_status from ferry.dead_letters order by event_id")
    dead = [tuple(d) for d in letters]
    assert dead == [("fails", i, 500) for i in ids], dead
