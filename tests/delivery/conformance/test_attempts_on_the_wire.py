"""Every request that reached the wire is an attempt the operator can see, including the one
the client sends again after the server closed the kept-alive connection it was written to."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import asyncpg

import pgferry
from pgferry.delivery.fasthttp import FastSender
from tests.delivery.conformance.scripted import Close, MakeScripted, Request, Script, Step, full
from tests.helpers import RunningRelay, eventually


def closes_each_connection_at_its_second_request() -> Script:
    seen: Counter[int] = Counter()

    def script(request: Request) -> Sequence[Step]:
        seen[request.connection] += 1
        return [Close()] if seen[request.connection] == 2 else [full(200)]

    return script


async def test_the_client_reports_the_try_on_a_connection_the_server_had_closed(scripted: MakeScripted) -> None:
    server = await scripted(closes_each_connection_at_its_second_request())
    sender = FastSender(pool_size=1)
    try:
        first = await sender.send(server.url("/hook"), b"{}", {}, timeout=2, connect_timeout=1)
        second = await sender.send(server.url("/hook"), b"{}", {}, timeout=2, connect_timeout=1)
    finally:
        await sender.close()
    assert first.ok and not first.earlier
    assert second.ok and [e.error_class for e in second.earlier] == ["empty_reply"], second
    assert "sent again on a new connection" in (second.earlier[0].error or "")
    assert [r.connection for r in server.requests] == [1, 1, 2]


async def test_a_request_sent_again_on_a_new_connection_leaves_two_attempts(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, scripted: MakeScripted
) -> None:
    server = await scripted(closes_each_connection_at_its_second_request())
    await ferry.subscribe("hook", ["s"], server.url("/hook"))
    ids = []
    for n in range(2):  # one after the other, so the second reuses the first's connection
        ids.append(await ferry.publish("s", {"n": n}))

        async def attempted(count: int = n + 1) -> bool:
            return bool(await conn.fetchval("select count(distinct event_id) from ferry.attempt_history()") == count)

        await eventually(attempted, what=f"event {n} attempted")

    async def settled() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.attempt_history() where error_class is null") == 2)

    await eventually(settled, what="both events delivered")
    rows = await conn.fetch("select event_id, attempt, status, error_class from ferry.attempt_history() order by id")
    assert [tuple(r) for r in rows] == [
        (ids[0], 1, 200, None), (ids[1], 1, None, "empty_reply"), (ids[1], 2, 200, None),
    ]  # fmt: skip
    webhook_ids = [r.headers["webhook-id"] for r in server.requests]
    assert webhook_ids == [f"evt_{ids[0]}", f"evt_{ids[1]}", f"evt_{ids[1]}"]
