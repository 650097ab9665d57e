"""Many subscriptions, one statement: ferry.webhook_steps and the relay's Stepper (issue 16).

Subscriptions at the same position on the same streams share one read of a
tick's events; every subscription's acknowledgement rides in the same
statement; one subscription refused (cursor moved, another relay's epoch,
gone, fallen out of retention) fails only its own step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson
import pytest

import pgferry
from pgferry.delivery.steps import Step, Stepper
from pgferry.receiver import Receiver, Respond
from tests.helpers import RunningRelay, eventually, owns, received, webhook_steps


async def _steps(
    conn: asyncpg.Connection, *requests: dict[str, Any], attempts: Sequence[tuple[Any, ...]] = ()
) -> list[Any]:
    """ferry.webhook_steps with one dict per request (subscription, and optional settings)."""

    def col(name: str, default: Any = None) -> list[Any]:
        return [r.get(name, default) for r in requests]

    return await webhook_steps(
        conn, col("subscription"), ["webhook:" + r["subscription"] for r in requests], epochs=col("epoch"),
        ordered=col("ordered", False), ack_from=col("ack_from"), ack_to=col("ack_to"), peeks=col("peek", True),
        peek_after=col("peek_after"),
        # one attempt per event (as a relay of 0031 passes them)
        attempt_req=[a[0] for a in attempts], event_ids=[a[1] for a in attempts], attempt_nos=[a[2] for a in attempts],
        statuses=[a[3] for a in attempts], latencies=[a[4] for a in attempts],
    )  # fmt: skip


async def test_subscriptions_at_one_position_share_one_read_and_the_rest_read_alone(
    conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    for name in ("a", "b", "c"):
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/x")
    await ferry.subscribe("big", ["s"], "http://127.0.0.1:9/x", filter="$.n > 0")
    await ferry.subscribe("keys", ["s"], "http://127.0.0.1:9/x", ordered=True)
    await ferry.publish("s", {"n": 0}, key="k")
    await ferry.publish("s", {"n": 1}, key="k")
    await conn.execute("select ferry.tick(true)")
    rows = await _steps(conn, *({"subscription": s, "ordered": s == "keys"} for s in ("a", "b", "c", "big", "keys")))
    by_reqs = Counter(tuple(r["reqs"]) for r in rows if r["id"] is not None)
    # a, b and c: one read, each row once for the three of them; the filtered and the ordered
    # subscription alone (their rows differ).
    assert by_reqs == {(1, 2, 3): 2, (4,): 1, (5,): 2}
    assert [orjson.loads(r["payload"])["n"] for r in rows if r["reqs"] == [4] and r["id"]] == [1]
    # Every request also gets one row without an event: its range, to acknowledge.
    assert sorted(tuple(r["reqs"]) for r in rows if r["id"] is None) == [(1, 2, 3), (4,), (5,)]

    # Acknowledge a and b (with their attempts), read on: nothing new, so no rows.
    start, end = rows[0]["start_tick"], rows[0]["end_tick"]
    ids = [r["id"] for r in rows if r["reqs"] == [1, 2, 3] and r["id"]]
    after = await _steps(
        conn,
        {"subscription": "a", "ack_from": start, "ack_to": end},
        {"subscription": "b", "ack_from": start, "ack_to": end, "peek": False},
        attempts=[(1, ids[0], 1, 200, 1.5), (2, ids[0], 1, 200, 2.5), (2, ids[1], 1, 200, 2.5)],
    )
    assert after == []
    cursors = dict(
        await conn.fetch("select name, tick_id from ferry.consumers where name in ('webhook:a', 'webhook:c')")
    )
    assert cursors == {"webhook:a": end, "webhook:c": start}
    recorded = await conn.fetch("select subscription, count(*) from ferry.attempt_history() group by 1 order by 1")
    assert [tuple(r) for r in recorded] == [("a", 1), ("b", 2)]


async def test_a_refused_step_fails_only_its_own_subscription(conn: asyncpg.Connection, ferry: pgferry.Ferry) -> None:
    for name in ("ok", "moved", "claimed"):
        await ferry.subscribe(name, ["s"], "http://127.0.0.1:9/x")
    claim = "select epoch from ferry._claim_consumers(77, array['webhook:claimed'], 1)"
    epoch = await conn.fetchval(claim)
    await conn.execute("select pg_advisory_unlock_all()")
    assert await conn.fetchval(claim) == epoch + 1  # another relay claims it after us
    await ferry.publish("s", {"n": 0})
    start = await conn.fetchval("select tick_id from ferry.consumers where name = 'webhook:ok'")
    end = await conn.fetchval("select ferry.tick(true)")
    rows = await _steps(
        conn,
        {"subscription": "ok", "ack_from": start, "ack_to": end},
        {"subscription": "moved", "ack_from": start - 1, "ack_to": end},
        {"subscription": "claimed", "epoch": epoch},
        {"subscription": "nobody"},
        {"subscription": "ok", "peek_after": -1, "ack_from": None},
    )
    refused = {r["reqs"][0]: r["refused"] for r in rows if r["refused"] is not None}
    assert refused == {2: "PF001", 3: "PF002", 4: "42704", 5: "55000"}
    assert await conn.fetchval("select tick_id from ferry.consumers where name = 'webhook:ok'") == end


async def test_a_relay_reads_once_per_tick_for_many_subscriptions_and_delivers_each_event_once(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    subscriptions, events = 200, 20
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start(path="")
    await conn.execute(
        "select ferry.subscribe('fan-' || n, array['fan'], $1 || '/fan-' || n) from generate_series(1, $2) n",
        url, subscriptions,
    )  # fmt: skip
    relay = RunningRelay(db_url)
    try:
        await eventually(
            lambda: owns(relay.relay, subscriptions), timeout=30, what="the relay owning every subscription"
        )
        stepper = relay.relay.ownership.ctx.steps if relay.relay.ownership else None
        assert stepper is not None
        before_statements, before_steps = stepper.statements, stepper.steps
        for n in range(events):
            await ferry.publish("fan", {"n": n})
        await eventually(
            lambda: received(receiver, subscriptions * events), timeout=60, what="every event at every endpoint"
        )
        statements, steps = stepper.statements - before_statements, stepper.steps - before_steps
    finally:
        await relay.stop()
        await receiver.stop()
    seen = Counter((r.path, orjson.loads(r.body)["n"]) for r in receiver.received)
    assert len(seen) == subscriptions * events and max(seen.values()) == 1
    # Every subscription stepped at least once per batch; the statements did not grow with them.
    assert steps >= subscriptions
    assert statements * 10 <= steps, f"{statements} statements for {steps} steps"


async def test_subscriptions_on_different_streams_share_one_read_of_the_range(
    conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    for name in ("x", "y", "z"):
        await ferry.subscribe(name, [name], "http://127.0.0.1:9/x")
    await ferry.subscribe("xy", ["x", "y"], "http://127.0.0.1:9/x")
    for stream in ("x", "y", "other"):
        await ferry.publish(stream, {"on": stream})
    await conn.execute("select ferry.tick(true)")
    rows = await _steps(conn, *({"subscription": s} for s in ("x", "y", "z", "xy")))
    got = {(r["stream"], tuple(r["reqs"])) for r in rows if r["id"] is not None}
    assert got == {("x", (1, 4)), ("y", (2, 4))}  # z: nothing on its stream; nobody reads "other"
    assert [tuple(r["reqs"]) for r in rows if r["id"] is None] == [(1, 2, 3, 4)]


async def test_a_step_rolled_back_as_a_deadlock_s_victim_is_sent_again_and_its_batches_are_not(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    """`pgferry apply` (even --dry-run) locking consumer rows in another order than the relay's
    statement made one of them a deadlock's victim; when it was the relay's, every worker in the
    statement failed and sent its delivered batches again (hundreds of duplicates per deadlock;
    outside probe). A trigger plays the deadlock here: the first three acknowledgements that
    move a cursor are rolled back with the deadlock's SQLSTATE."""
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start(path="")
    for name in ("a", "b"):
        await ferry.subscribe(name, ["s"], f"{url}/{name}")
    await conn.execute("create sequence victims")
    await conn.execute(
        """create function pretend_deadlock() returns trigger language plpgsql as $$
           begin
               -- (the relay's sessions search pg_catalog only: the sequence is named with its schema)
               if new.tick_id is distinct from old.tick_id and nextval('public.victims') <= 3 then
                   raise exception 'deadlock detected (pretended)' using errcode = '40P01';
               end if;
               return new;
           end $$"""
    )
    await conn.execute(
        "create trigger pretend before update on ferry.consumers for each row execute function pretend_deadlock()"
    )
    for n in range(20):  # a backlog: the relay's first acknowledgements are of delivered batches
        await ferry.publish("s", {"n": n})
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: received(receiver, 40), timeout=30, what="every event at both endpoints")
        await eventually(
            lambda: _cursors_at_the_end(conn), timeout=30, what="the cursors past the backlog"
        )  # every acknowledgement recorded: nothing left to be sent again
    finally:
        await relay.stop()
        await receiver.stop()
    assert await conn.fetchval("select last_value from victims") > 3  # the pretended deadlocks happened
    seen = Counter((r.path, orjson.loads(r.body)["n"]) for r in receiver.received)
    assert len(seen) == 40 and max(seen.values()) == 1, seen.most_common(3)


async def _cursors_at_the_end(conn: asyncpg.Connection) -> bool:
    last = await conn.fetchval("select max(id) from ferry.events")
    behind = await conn.fetchval(
        "select count(*) from ferry.consumers c where c.subscription in ('a', 'b') and exists "
        "(select 1 from ferry.events e, ferry.ticks t where t.id = c.tick_id and e.id = $1 "
        "and not pg_visible_in_snapshot(e.txid, t.snapshot))",
        last,
    )
    return bool(behind == 0)


async def test_an_error_taking_a_statement_s_answer_fails_its_steps_instead_of_hanging_every_worker(
    db_url: str, ferry: pgferry.Ferry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Outside probe: under a memory limit, an error after the statement returned (a MemoryError
    building a 62 MB event's batch) left every step of it unanswered: every worker of the relay
    waited for good, in silence, and status looked healthy. The steps fail now; their workers
    start over (a fault injected once in reading an answer; the rest is the real relay)."""
    receiver = Receiver(lambda _: Respond())
    url = await receiver.start(path="")
    for name in ("a", "b"):
        await ferry.subscribe(name, ["s"], f"{url}/{name}")
    statement = Stepper._statement
    failed: list[bool] = []

    class Unreadable(list[asyncpg.Record]):  # an answer that cannot be read (once)
        def __iter__(self) -> Any:
            failed.append(True)
            raise MemoryError

    async def answer_once_unreadable(self: Stepper, batch: list[Step], *args: Any) -> list[asyncpg.Record]:
        rows = await statement(self, batch, *args)
        if rows and not failed and any(step.peek for step in batch):
            return Unreadable(rows)
        return rows

    monkeypatch.setattr(Stepper, "_statement", answer_once_unreadable)
    for n in range(10):
        await ferry.publish("s", {"n": n})
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: received(receiver, 20), timeout=30, what="every event at both endpoints")
    finally:
        await relay.stop()
        await receiver.stop()
    assert failed  # the fault happened
    assert "could not take the answer of steps" in caplog.text
