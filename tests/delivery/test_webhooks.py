"""Webhook delivery end to end: real PostgreSQL, real relay, real HTTP receivers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections import defaultdict

import asyncpg
import orjson
import pytest
import standardwebhooks

import pgferry
from pgferry import sql
from pgferry.delivery.jetstream import RESERVED
from pgferry.delivery.signing import new_secret
from pgferry.receiver import Action, Drop, Hang, Received, Receiver, Respond, Slow
from tests.helpers import FAST_RETRY, MakeReceiver, RunningRelay, all_delivered, eventually, received_ids


async def test_delivers_payload_with_standard_webhook_headers(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    secret = new_secret()
    await conn.execute(
        "select ferry.subscribe('orders-hook', array['public.orders'], $1, secret => $2, headers => $3)",
        url, secret, {"Authorization": "Bearer t0ken"},
    )  # fmt: skip
    await conn.execute("create table orders (id int primary key, item text)")
    await conn.execute("select ferry.capture_table('orders')")
    await conn.execute("insert into orders values (1, 'spice'), (2, 'water')")
    await eventually(_count_at_least(receiver, 2), what="two deliveries")

    first = receiver.received[0]
    assert orjson.loads(first.body) == {
        "type": "INSERT", "table": "orders", "schema": "public",
        "record": {"id": 1, "item": "spice"}, "old_record": None,
    }  # fmt: skip
    assert first.headers["content-type"] == "application/json"
    assert first.headers["authorization"] == "Bearer t0ken"
    assert first.headers["pgferry-stream"] == "public.orders" and first.headers["pgferry-key"] == "1"
    wh = standardwebhooks.Webhook(secret)
    assert wh.verify(first.body, first.headers) == orjson.loads(first.body)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(first.body, first.headers)

    async def recorded() -> bool:  # the relay records attempts right after the answers arrive
        return bool(await conn.fetchval("select count(*) from ferry.attempt_history()") == 2)

    await eventually(recorded, what="two attempt rows")
    attempts = await conn.fetch("select * from ferry.attempt_history() order by id")
    assert [(a["subscription"], a["status"], a["error_class"]) for a in attempts] == [("orders-hook", 200, None)] * 2
    assert all(a["latency_ms"] > 0 for a in attempts)


def _count_at_least(receiver: Receiver, n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return len(receiver.received) >= n

    return check


async def test_flaky_receiver_gets_everything_and_duplicates_share_a_webhook_id(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    rng = random.Random(7)

    def flaky(_: Received) -> Action:
        roll = rng.random()
        if roll < 0.10:
            return Respond(500, b"oops")
        if roll < 0.15:
            return Drop()
        return Respond()

    receiver, url = await receiver_factory(flaky)
    await conn.execute(f"select ferry.subscribe('flaky', array['s'], $1, {FAST_RETRY})", url)
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(600)])
    await all_delivered(receiver, set(ids))

    bodies: dict[str, set[bytes]] = defaultdict(set)
    for r in receiver.received:
        bodies[r.headers["webhook-id"]].add(r.body)
    assert all(len(b) == 1 for b in bodies.values()), "one webhook-id carried different bodies"
    failures = await conn.fetch(
        "select error_class, count(*) from ferry.attempt_history() where error_class is not null group by 1"
    )
    classes = {r["error_class"] for r in failures}
    assert classes <= {"http_status", "empty_reply", "reset"} and "http_status" in classes
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0


async def test_receiver_down_then_back_keeps_per_key_order(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    down = True

    def maybe_down(_: Received) -> Action:
        return Respond(503, b"down") if down else Respond()

    receiver, url = await receiver_factory(maybe_down)
    await conn.execute(
        f"select ferry.subscribe('ordered', array['s'], $1, ordered => true, max_attempts => 1000, {FAST_RETRY})", url
    )
    ids = []
    for n in range(300):
        ids.append(await ferry.publish("s", {"n": n}, key=f"k{n % 7}"))
        if n == 150:
            await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)
    assert receiver.received == []
    assert await conn.fetchval("select count(*) from ferry.retries") > 0
    down = False
    await all_delivered(receiver, set(ids))

    per_key: dict[str, list[int]] = defaultdict(list)
    for r in receiver.received:
        per_key[r.headers["pgferry-key"]].append(int(r.headers["webhook-id"].removeprefix("evt_")))
    for key, seen in per_key.items():
        assert seen == sorted(seen), f"key {key} delivered out of order"
    assert len(received_ids(receiver)) == len(ids), "duplicates without a crash"


async def test_hanging_endpoint_does_not_slow_a_healthy_one(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    hanging, hang_url = await receiver_factory(lambda _: Hang())
    healthy, ok_url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hangs', array['s'], $1, timeout_ms => 30000)", hang_url)
    await conn.execute("select ferry.subscribe('healthy', array['s'], $1)", ok_url)
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(500)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    await all_delivered(healthy, set(ids))
    assert loop.time() - started < 5
    assert hanging.stats.requests > 0 and hanging.received == []


async def test_410_gone_disables_the_subscription(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    _, url = await receiver_factory(lambda _: Respond(410, b"gone"))
    await conn.execute("select ferry.subscribe('gone', array['s'], $1)", url)
    await ferry.publish("s", {"n": 1})

    async def disabled() -> bool:
        return bool(await conn.fetchval("select state from ferry.subscriptions where name = 'gone'") == "disabled")

    await eventually(disabled, what="the subscription to be disabled")
    reason = await conn.fetchval("select state_reason from ferry.subscriptions where name = 'gone'")
    assert "410 Gone" in reason
    assert await conn.fetchval("select count(*) from ferry.retries") == 1  # kept for when it is resumed


async def test_retry_after_is_honoured(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    calls: list[float] = []

    def throttled(r: Received) -> Action:
        calls.append(r.at)
        return Respond(429, b"slow down", (("Retry-After", "2"),)) if len(calls) == 1 else Respond()

    receiver, url = await receiver_factory(throttled)
    await conn.execute(f"select ferry.subscribe('throttled', array['s'], $1, {FAST_RETRY})", url)
    event_id = await ferry.publish("s", {})
    await all_delivered(receiver, {event_id})
    assert calls[1] - calls[0] >= 1.9


async def test_dead_letters_after_max_attempts_then_replay(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    healthy = False

    def failing(_: Received) -> Action:
        return Respond() if healthy else Respond(500, b"database on fire")

    receiver, url = await receiver_factory(failing)
    await conn.execute(f"select ferry.subscribe('dies', array['s'], $1, max_attempts => 3, {FAST_RETRY})", url)
    event_id = await ferry.publish("s", {"x": 1})

    async def dead() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 1)

    await eventually(dead, what="a dead letter")
    letter = await conn.fetchrow("select * from ferry.dead_letters")
    assert (letter["event_id"], letter["attempts"], letter["last_status"]) == (event_id, 3, 500)
    assert letter["last_error"].startswith("HTTP 500") and letter["last_response"] == "database on fire"
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where event_id = $1", event_id) == 3

    healthy = True
    assert await conn.fetchval("select ferry.dlq_replay('dies')") == 1
    await all_delivered(receiver, {event_id})
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0


async def test_events_with_keys_too_long_for_a_btree_are_parked_retried_and_buried_once(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """A btree entry holds at most 2,704 bytes: parking an event with a longer key failed, and the
    worker sent its batch again for good (outside probe). Ordered, so that a key's later events
    wait behind its parked one."""

    def failing(received: Received) -> Action:
        return Respond(500, b"no") if orjson.loads(received.body)["fail"] else Respond()

    receiver, url = await receiver_factory(failing)
    await conn.execute(
        f"select ferry.subscribe('long-keys', array['s'], $1, max_attempts => 3, ordered => true, {FAST_RETRY})", url
    )
    first, second = secrets.token_urlsafe(2400), secrets.token_urlsafe(75_000)  # incompressible
    plan = [(first, False), (first, True), (first, False), (second, True), (second, False)]
    ids = await ferry.publish_many([{"stream": "s", "key": k, "payload": {"fail": f}} for k, f in plan])
    good = {i for i, (_, fail) in zip(ids, plan, strict=True) if not fail}

    async def buried() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 2)

    await eventually(buried, what="two dead letters")
    await all_delivered(receiver, good)
    await asyncio.sleep(0.3)
    sent = [int(r.headers["webhook-id"].removeprefix("evt_")) for r in receiver.received]
    assert sorted(i for i in sent if i in good) == sorted(good), "each good event once"
    letters = await conn.fetch("select event_id, attempts, last_status from ferry.dead_letters order by event_id")
    assert [tuple(r) for r in letters] == [(ids[1], 3, 500), (ids[3], 3, 500)]


async def test_batches_of_events_per_request(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('batched', array['s'], $1, batch_size => 10)", url)
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}, "key": str(n)} for n in range(35)])

    async def got_all() -> bool:
        return sum(len(orjson.loads(r.body)["data"]) for r in receiver.received) >= 35

    await eventually(got_all, what="35 batched events")
    items = [item for r in receiver.received for item in orjson.loads(r.body)["data"]]
    assert sorted(i["id"] for i in items) == ids
    assert all(len(orjson.loads(r.body)["data"]) <= 10 for r in receiver.received)
    assert items[0]["payload"] == {"n": 0} and items[0]["stream"] == "s" and items[0]["key"] == "0"


async def test_a_stream_listed_twice_delivers_each_event_once(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """Outside probe: `--stream s --stream s` stored {s,s}, and the batch read matched each event of s
    to the subscription once per listing: every event came twice (twice in one data[] when batched).
    Streams are kept once, in the order given, and migration 0038 does the same to stored ones."""
    single, single_url = await receiver_factory()
    batched, batched_url = await receiver_factory()
    await conn.execute("select ferry.subscribe('twice', array['s', 't', 's'], $1)", single_url)
    await conn.execute("select ferry.subscribe('twice-batched', array['s', 's'], $1, batch_size => 10)", batched_url)
    await conn.execute("select ferry.register_consumer('reader', array['t', 's', 't'])")
    assert await conn.fetchval("select streams from ferry.subscriptions where name = 'twice'") == ["s", "t"]
    assert await conn.fetchval("select streams from ferry.consumers where name = 'webhook:twice'") == ["s", "t"]
    assert await conn.fetchval("select streams from ferry.consumers where name = 'reader'") == ["t", "s"]
    ids = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(20)])
    await all_delivered(single, set(ids))
    await eventually(lambda: _batched_ids_at_least(batched, 20), what="20 batched events")
    await asyncio.sleep(0.3)  # a second copy would be right behind
    assert sorted(received_ids(single)) == ids and len(single.received) == 20
    assert sorted(i["id"] for r in batched.received for i in orjson.loads(r.body)["data"]) == ids
    # Stored before 0038: the migration keeps each stream once.
    await conn.execute("update ferry.subscriptions set streams = '{s,t,s}' where name = 'twice'")
    await conn.execute("update ferry.consumers set streams = '{t,s,t}' where name = 'reader'")
    (fix,) = [m for m in sql.migrations() if m.version == 38]
    await conn.execute(fix.sql)
    assert await conn.fetchval("select streams from ferry.subscriptions where name = 'twice'") == ["s", "t"]
    assert await conn.fetchval("select streams from ferry.consumers where name = 'reader'") == ["t", "s"]


def _batched_ids_at_least(receiver: Receiver, n: int) -> bool:
    return sum(len(orjson.loads(r.body)["data"]) for r in receiver.received) >= n


async def test_new_subscription_starts_from_now_unless_asked(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    old = await ferry.publish("s", {"old": True})
    await asyncio.sleep(0.3)  # ticked
    now_receiver, now_url = await receiver_factory()
    all_receiver, all_url = await receiver_factory()
    await conn.execute("select ferry.subscribe('from-now', array['s'], $1)", now_url)
    await conn.execute("select ferry.subscribe('from-start', array['s'], $1, start_at => 'beginning')", all_url)
    new = await ferry.publish("s", {"old": False})
    await all_delivered(all_receiver, {old, new})
    await all_delivered(now_receiver, {new})
    assert received_ids(now_receiver) == [new]


@pytest.mark.parametrize(
    ("url", "headers", "message"),
    [
        ("not a url", {}, "is not an absolute URL"),
        ("ftp://example.com/x", {}, "unsupported URL scheme 'ftp'"),
        ("http://exa mple.com/x", {}, "malformed URL"),
        ("http://127.0.0.1/x", [1, 2], "headers must be a JSON object"),
        ("http://127.0.0.1/x", {"X-Bad": "a\r\nInjected: 1"}, "contains a line break"),
        ("http://127.0.0.1/x", {"Bad Name": "v"}, "is not a valid HTTP header name"),
        ("http://127.0.0.1/x", {"X-Num": 5}, "must be a string"),
        ("http://127.0.0.1/x", {"X-Tenant": "a", "x-tenant": "b"}, "'X-Tenant' is given more than once"),
        *(
            ("http://127.0.0.1/x", {name: "forged"}, f"header '{name}' is one pgferry sets itself")
            for name in sorted(RESERVED)  # what the relay leaves out is what subscribe refuses
        ),
    ],
)
async def test_subscribe_rejects_bad_input(conn: asyncpg.Connection, url: str, headers: object, message: str) -> None:
    with pytest.raises(asyncpg.PostgresError, match=message):
        await conn.execute("select ferry.subscribe('bad', array['s'], $1, headers => $2)", url, headers)


async def test_subscribe_rejects_bad_settings(conn: asyncpg.Connection) -> None:
    cases = [
        ("select ferry.subscribe('x y', array['s'], 'http://a/')", "subscription name"),
        ("select ferry.subscribe('x', array[]::text[], 'http://a/')", "at least one non-empty stream"),
        ("select ferry.subscribe('x', array['s'], 'http://a/', batch_size => 0)", "batch_size must be between"),
        ("select ferry.subscribe('x', array['s'], 'http://a/', secret => 'hunter2')", "whsec_"),
        ("select ferry.subscribe('x', array['s'], 'http://a/', secret => 'whsec_c2hvcnQ=')", "too short"),
        (
            "select ferry.subscribe('x', array['s'], 'http://a/', retry_base_ms => 5000, retry_max_ms => 1000)",
            "retry_base_ms \\(5000\\) is larger than retry_max_ms \\(1000\\)",
        ),
    ]
    for statement, message in cases:
        with pytest.raises(asyncpg.PostgresError, match=message):
            await conn.execute(statement)


async def test_unresolvable_host_and_oversized_payload_are_recorded_failures(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    # max_body_bytes is read at relay start: stop the relay before anything is
    # published (it must not send the big event under the old limit), restart it after.
    await relay.stop()
    await conn.execute("update ferry.config set max_body_bytes = 1000")
    await conn.execute(
        "select ferry.subscribe('nowhere', array['s'], 'http://no-such-host.invalid/hook', "
        f"max_attempts => 2, {FAST_RETRY})"
    )
    await conn.execute("select ferry.subscribe('limited', array['big'], $1)", url)
    await ferry.publish("s", {"n": 1})
    small = await ferry.publish("big", {"pad": "x" * 10})
    big = await ferry.publish("big", {"pad": "x" * 5000})

    async def both_dead() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 2)

    restarted = RunningRelay(relay.relay.url)
    try:
        await eventually(both_dead, timeout=30, what="two dead letters")
    finally:
        await restarted.stop()
    rows = {r["subscription"]: r for r in await conn.fetch("select * from ferry.dead_letters")}
    assert "cannot resolve host 'no-such-host.invalid'" in rows["nowhere"]["last_error"]
    assert rows["limited"]["event_id"] == big and "over the 1000-byte limit" in rows["limited"]["last_error"]
    assert received_ids(receiver) == [small]
    relay.stop_event.clear()
    relay.task = asyncio.create_task(relay.relay.run(relay.stop_event))


@pytest.mark.parametrize("ordered", [False, True])
async def test_a_batch_over_the_body_limit_goes_in_smaller_requests_and_only_a_too_large_event_dies(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver,
    ordered: bool,
) -> None:  # fmt: skip
    """100 events of 15 KB at batch_size 100 went to dead letters whole (over the 1 MB limit),
    though each one fit."""
    receiver, url = await receiver_factory()
    await relay.stop()  # max_body_bytes is read at relay start
    await conn.execute("update ferry.config set max_body_bytes = 2000")
    await conn.execute("select ferry.subscribe('batched', array['s'], $1, batch_size => 10, ordered => $2)",
                       url, ordered)  # fmt: skip
    ids = await ferry.publish_many(
        [{"stream": "s", "payload": {"pad": "x" * 300}, "key": str(n % 3)} for n in range(20)]
    )
    big = await ferry.publish("s", {"pad": "x" * 3000}, key="big")

    async def settled() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 1) and len(
            {item["id"] for r in receiver.received for item in orjson.loads(r.body)["data"]}
        ) == len(ids)

    restarted = RunningRelay(relay.relay.url)
    try:
        await eventually(settled, timeout=30, what="every event that fits delivered, the big one dead")
    finally:
        await restarted.stop()
    assert await conn.fetchval("select event_id from ferry.dead_letters") == big
    assert all(len(r.body) <= 2000 and len(orjson.loads(r.body)["data"]) >= 1 for r in receiver.received)
    if ordered:  # per key, in id order
        for key in ("0", "1", "2"):
            got = [i["id"] for r in receiver.received for i in orjson.loads(r.body)["data"] if i["key"] == key]
            assert got == sorted(got)
    relay.stop_event.clear()
    relay.task = asyncio.create_task(relay.relay.run(relay.stop_event))


async def test_secret_rotation_signs_with_every_secret(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    old, new = new_secret(), new_secret()
    async with conn.transaction():  # the relay sees the subscription with both secrets at once
        await conn.execute("select ferry.subscribe('rotating', array['s'], $1, secret => $2)", url, old)
        await conn.execute("select ferry.set_subscription_secrets('rotating', array[$1, $2])", old, new)
    event_id = await ferry.publish("s", {"n": 1})
    await all_delivered(receiver, {event_id})
    request = receiver.received[0]
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # receivers on either secret accept it during the rotation
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    with pytest.raises(asyncpg.PostgresError, match="whsec_"):
        await conn.execute("select ferry.set_subscription_secrets('rotating', array['nope'])")
    assert "whsec_" not in str(await ferry.subscriptions()), "secrets must not be listed"


async def test_dead_letter_bookkeeping_edges(conn: asyncpg.Connection, ferry: pgferry.Ferry) -> None:
    await conn.execute("select ferry.subscribe('edges', array['s'], 'http://127.0.0.1:9/x', ordered => true)")
    row = ("edges", "s", "k", "{}", None)
    await conn.execute(
        """insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                                      attempts, next_attempt_at)
           values ($1, 1, $2, $3, $4::jsonb, $5, now(), 3, now() + interval '10 minutes'),
                  ($1, 2, $2, $3, $4::jsonb, $5, now(), 0, now())""",
        *row,
    )
    # The event waiting behind the failed one of its key is not what the retry loop waits for.
    next_at = await conn.fetchval(sql.query("next_retry_at"), "edges", True, 0, 1)
    assert next_at is not None and next_at > await conn.fetchval("select now() + interval '9 minutes'")
    await conn.execute(
        """insert into ferry.dead_letters (subscription, event_id, stream, key, payload, event_created_at,
                                           attempts, first_failed_at)
           values ('edges', 1, 's', 'k', '{}', now(), 12, now()), ('edges', 3, 's', 'k', '{}', now(), 12, now())"""
    )
    # Event 1 is parked again already: replaying must not drop its dead letter.
    assert await conn.fetchval("select ferry.dlq_replay('edges')") == 1
    assert [r["event_id"] for r in await conn.fetch("select event_id from ferry.dead_letters")] == [1]
    assert await ferry.discard_dead_letters("edges", ids=[]) == 0  # an empty list is nothing, not everything
    assert await ferry.replay_dead_letters("edges", ids=[]) == 0
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 1


async def test_a_cursor_moved_by_another_process_is_followed_not_fatal(
    relay: RunningRelay,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two relays may deliver one subscription for a moment; the one whose acknowledgement
    finds the cursor elsewhere starts over from the cursor instead of failing."""
    requests = 0

    def hang_first(_: Received) -> Action:
        nonlocal requests
        requests += 1
        return Hang() if requests == 1 else Respond()

    receiver, url = await receiver_factory(hang_first)
    await conn.execute(f"select ferry.subscribe('moved', array['s'], $1, timeout_ms => 1000, {FAST_RETRY})", url)
    await asyncio.sleep(0.5)  # the relay's next round starts the worker
    await ferry.publish("s", {"n": "hung"})

    async def in_flight() -> bool:
        return requests >= 1

    await eventually(in_flight, what="the first request to hang")
    # What another relay's acknowledgement would do: move the cursor past the hung batch.
    await conn.execute("select ferry.tick()")
    await conn.execute(
        "update ferry.consumers set tick_id = (select max(id) from ferry.ticks) where name = 'webhook:moved'"
    )
    later = await ferry.publish("s", {"n": "later"})
    await all_delivered(receiver, {later})
    await eventually(lambda: _logged(caplog, "reading again from its cursor"), what="the worker to start over")
    assert await conn.fetchval("select count(*) from ferry.retries") == 0  # the failed batch was someone else's


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


async def test_a_subscription_removed_while_its_events_are_in_hand_stops_quietly(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Its worker failed with an ERROR and a traceback ("its consumer does not exist")."""
    _, url = await receiver_factory(lambda _: Respond(500, b"no"))
    await conn.execute(f"select ferry.subscribe('brief', array['s'], $1, {FAST_RETRY})", url)
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}, "key": str(n)} for n in range(20)])

    async def parked() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.retries where subscription = 'brief'"))

    await eventually(parked, what="events parked")
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(20)])
    await conn.execute("select ferry.unsubscribe('brief')")
    await asyncio.sleep(2)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not errors, errors


async def test_a_subscription_removed_while_its_requests_are_in_flight_is_said_to_be_removed(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Recording the answers, its worker warned that another relay had claimed it and that they
    would be sent again (outside probe: 85 such warnings in a soak, each an ERROR in PostgreSQL's log)."""
    arrived: list[Received] = []

    def slow(received: Received) -> Action:
        arrived.append(received)
        return Slow(1.0)

    _, url = await receiver_factory(slow)
    await ferry.subscribe("brief", ["s"], url)
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(5)])
    await eventually(lambda: bool(arrived), what="requests in flight")
    await ferry.unsubscribe("brief")
    await asyncio.sleep(2)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "brief" in r.getMessage()]
    assert not said, said


async def test_nothing_committed_after_a_pause_returns_is_delivered(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """Outside probe: the relay learned of a pause at its next ownership round, up to 2 s later, and
    the 20 events committed right after `pgferry subscription pause` returned were delivered. The
    pause is notified now, and the delivering relay stops the worker at once."""
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["s"], url)
    first = await ferry.publish("s", {"n": 0})
    await all_delivered(receiver, {first})  # a worker is delivering it
    await ferry.pause("hook")
    after = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(1, 21)])
    await asyncio.sleep(3)  # longer than an ownership round
    assert received_ids(receiver) == [first]
    await ferry.resume("hook")
    await all_delivered(receiver, {first, *after})


async def test_events_committed_after_a_subscription_s_url_changed_go_to_the_new_url(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """A second outside probe: the relay took a changed URL at its next ownership round, up to 2 s
    later, and events committed after `subscription add NAME --url NEW` returned (a replay too) went
    to the old one; into Redis, whose duplicate marks then dropped the replay, recorded delivered.
    ferry.subscribe notifies, and the relay's round starts at once."""
    old, old_url = await receiver_factory()
    new, new_url = await receiver_factory()
    await ferry.subscribe("moving", ["s"], old_url)
    first = await ferry.publish("s", {"n": 0})
    await all_delivered(old, {first})  # a worker is delivering it
    await asyncio.sleep(0.5)  # into the relay's round wait
    await ferry.subscribe("moving", ["s"], new_url)
    after = await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(1, 21)])
    await all_delivered(new, set(after))
    assert received_ids(old) == [first]
