"""Filters at a subscription (migration 0012): only matching events are sent, the cursor moves past
the rest, bad filters are refused at subscribe. Real PostgreSQL, a real relay, receivers on 127.0.0.1."""

from __future__ import annotations

import asyncpg
import orjson
import pytest

import pgferry
from pgferry import sql
from pgferry.errors import PgferryError
from pgferry.receiver import Receiver
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually


def bodies(receiver: Receiver) -> list[object]:
    return [orjson.loads(r.body) for r in receiver.received]


def delivered_ids(receiver: Receiver) -> set[int]:
    return {int(r.headers["webhook-id"].removeprefix("evt_")) for r in receiver.received}


async def _all_caught_up(conn: asyncpg.Connection, *subscriptions: str) -> None:
    """Every subscription's cursor passed a tick taken now: all committed so far was read, and sent or skipped."""
    tick = await conn.fetchval("select ferry.tick(true)")

    async def check() -> bool:
        behind = await conn.fetchval(
            "select count(*) from ferry.consumers where name = any($1::text[]) and tick_id < $2",
            [f"webhook:{s}" for s in subscriptions], tick,
        )  # fmt: skip
        return bool(behind == 0)

    await eventually(check, timeout=20, what=f"{', '.join(subscriptions)} to read everything")


async def test_only_captured_rows_the_filter_matches_reach_the_receiver(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    big, big_url = await receiver_factory()
    becoming_paid, paid_url = await receiver_factory()
    await conn.execute("create table orders (id int primary key, amount numeric, status text)")
    await conn.execute("select ferry.capture_table('orders')")
    await ferry.subscribe("big", ["public.orders"], big_url, filter="$.record.amount > 100")
    paid = '$.type == "UPDATE" && $.record.status == "paid" && $.old_record.status != "paid"'
    await ferry.subscribe("paid-updates", ["public.orders"], paid_url, filter=paid)
    await conn.execute("insert into orders values (1, 50, 'new'), (2, 150, 'new'), (3, null, 'new'), (4, 100.5, 'new')")
    await conn.execute("update orders set status = 'paid' where id in (1, 2)")
    await conn.execute("update orders set amount = 10 where id = 1")  # still paid: not a transition
    await _all_caught_up(conn, "big", "paid-updates")

    assert sorted((b["type"], b["record"]["id"]) for b in bodies(big)) == [  # type: ignore[index]
        ("INSERT", 2), ("INSERT", 4), ("UPDATE", 2)]  # fmt: skip
    assert sorted(b["record"]["id"] for b in bodies(becoming_paid)) == [1, 2]  # type: ignore[index]
    # Skipped events leave no attempt and no parked row: they were never sent.
    assert await conn.fetchval("select count(*) from ferry.attempt_history() where subscription = 'big'") == 3
    assert await conn.fetchval("select count(*) from ferry.retries") == 0


async def test_a_batch_whose_every_event_is_filtered_out_still_moves_the_cursor(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("rare", ["s"], url, filter="$.wanted == true", batch_size=10, ordered=True)
    await conn.execute("select ferry.publish('s', jsonb_build_object('n', n), 'k' || n % 3) "
                       "from generate_series(1, 500) n")  # fmt: skip
    await _all_caught_up(conn, "rare")
    assert receiver.received == []
    assert await conn.fetchval("select count(*) from ferry.attempt_history()") == 0

    wanted = await ferry.publish("s", {"wanted": True}, key="k1")
    await eventually(lambda: _some(receiver), what="the one matching event")
    assert delivered_ids(receiver) == {wanted}
    [body] = bodies(receiver)
    assert [e["payload"] for e in body["data"]] == [{"wanted": True}]  # type: ignore[index]
    await _all_caught_up(conn, "rare")


async def _some(receiver: Receiver) -> bool:
    return bool(receiver.received)


async def test_filters_see_the_stream_key_and_headers_as_variables(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    by_headers, headers_url = await receiver_factory()
    by_key, key_url = await receiver_factory()
    by_stream, stream_url = await receiver_factory()
    await ferry.subscribe("tenant", ["a", "b"], headers_url, filter='$headers.tenant == "acme"')
    await ferry.subscribe("vip", ["a", "b"], key_url, filter='$key starts with "vip-"')
    await ferry.subscribe("only-b", ["a", "b"], stream_url, filter='$stream == "b" && $.n >= 2')
    ids = {}
    for n, (stream, key, headers) in enumerate([
        ("a", "vip-1", {"tenant": "acme"}), ("b", "vip-2", None), ("b", None, {"tenant": "other"}),
        ("a", "plain", {"tenant": "acme", "x": "1"}), ("b", "vip-3", {"tenant": "acme"}),
    ]):  # fmt: skip
        ids[n] = await ferry.publish(stream, {"n": n}, key=key, headers=headers)
    await _all_caught_up(conn, "tenant", "vip", "only-b")
    assert delivered_ids(by_headers) == {ids[0], ids[3], ids[4]}
    assert delivered_ids(by_key) == {ids[0], ids[1], ids[4]}
    assert delivered_ids(by_stream) == {ids[2], ids[4]}


async def test_json_null_and_missing_fields_match_only_filters_that_ask_for_them(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    filters = {
        "over-100": "$.amount > 100",  # null, missing and a string: unknown or false, so not sent
        "is-null": "$.amount == null",  # JSON null only, not a missing field
        "missing": "!exists($.amount)",
        "not-a-number": "($.amount > 100) is unknown",  # a comparison that cannot be made (a string); missing: false
        "no-key": "$key == null",
        "no-headers": "$headers == null",
    }
    receivers = {}
    for name, text in filters.items():
        receivers[name], url = await receiver_factory()
        await ferry.subscribe(name, ["s"], url, filter=text)
    events = {
        "big": await ferry.publish("s", {"amount": 150}, key="k", headers={"h": "1"}),
        "null": await ferry.publish("s", {"amount": None}, key="k"),
        "missing": await ferry.publish("s", {"other": 1}, headers={"h": "1"}),
        "string": await ferry.publish("s", {"amount": "150"}),
        "scalar": await ferry.publish("s", 42),
    }
    await _all_caught_up(conn, *filters)
    got = {name: {k for k, v in events.items() if v in delivered_ids(r)} for name, r in receivers.items()}
    assert got == {
        "over-100": {"big"},
        "is-null": {"null"},
        "missing": {"missing", "scalar"},  # lax mode: a number has no field amount
        "not-a-number": {"string"},
        "no-key": {"missing", "string", "scalar"},
        "no-headers": {"null", "string", "scalar"},
    }


async def test_changing_a_filter_applies_from_the_cursor_on_and_subscribing_without_one_removes_it(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("colour", ["s"], url, filter='$.colour == "red"')
    first = [await ferry.publish("s", {"colour": c}) for c in ("red", "blue")]
    await _all_caught_up(conn, "colour")
    assert delivered_ids(receiver) == {first[0]}

    await ferry.subscribe("colour", ["s"], url, filter='$.colour == "blue"')
    second = [await ferry.publish("s", {"colour": c}) for c in ("red", "blue")]
    await _all_caught_up(conn, "colour")
    assert delivered_ids(receiver) == {first[0], second[1]}  # the blue one passed before is not sent now

    await ferry.subscribe("colour", ["s"], url)
    assert await conn.fetchval("select filter from ferry.subscriptions where name = 'colour'") is None
    third = [await ferry.publish("s", {"colour": c}) for c in ("red", "green")]
    await _all_caught_up(conn, "colour")
    assert delivered_ids(receiver) == {first[0], second[1], *third}


BAD_FILTERS = [
    ("$.amount >", "is not a valid jsonpath: syntax error"),
    ("", "is not a valid jsonpath"),
    ('$.name like_regex "(" ', "is not a valid jsonpath: invalid regular expression"),
    ("$.record.amount", "is not a predicate (true or false for an event): single boolean result is expected"),
    ("$key", "is not a predicate"),
    ("$.amount + 1", "is not a predicate"),
    ('$tenant == "acme"', "uses an unknown variable: $tenant"),
    # behind a left side that is false for the documents the check evaluates (outside probe: every
    # read of the subscription failed from its first matching event on, and status said it was fine)
    ('$.record.status == "paid" && $tenant == "a"', "uses an unknown variable: $tenant"),
    ("exists($.x ? (@ == $nope))", "uses an unknown variable: $nope"),
    ('$.a == "x$" && $"we ird" == 1', "uses an unknown variable: $we ird"),
    ("$.a == 1 || " * 100 + "true", "must be at most 1000 characters"),
    ('exists($.** ? (@ == "x"))', "uses .** without a bound"),
    ('exists($.**{2 to last} ? (@ == "x"))', "uses .** without a bound"),
    ('exists($.**{0 to 5000} ? (@ == "x"))', "uses .** without a bound"),
]


async def test_a_bounded_descent_over_a_payload_nested_12000_deep_filters_it_out_instead_of_failing_the_read(
    conn: asyncpg.Connection,
) -> None:
    deep = "[" * 12000 + "1" + "]" * 12000
    for text in ('exists($.**{0 to 50} ? (@ == "x"))', '$.a == ".** in a string is no descent"', '$.a == "$b"'):
        await conn.execute("select ferry._check_filter($1)", text)
        assert not await conn.fetchval(
            "select ferry._filter_match($1::jsonpath, 's', null, null, jsonb_build_object('a', $2::jsonb))", text, deep
        )


@pytest.mark.parametrize(("text", "reason"), BAD_FILTERS)
async def test_subscribe_refuses_a_bad_filter_with_the_reason_and_keeps_the_old_one(
    conn: asyncpg.Connection, text: str, reason: str
) -> None:
    await conn.execute("select ferry.subscribe('s', array['s'], 'http://127.0.0.1:9/x', filter => '$.ok == true')")
    with pytest.raises(asyncpg.PostgresError) as refused:
        await conn.execute("select ferry.subscribe('s', array['s'], 'http://127.0.0.1:9/x', filter => $1)", text)
    assert refused.value.sqlstate == "22023"
    assert str(refused.value).startswith("pgferry: filter ") and reason in str(refused.value)
    assert "$stream" in (refused.value.hint or "")  # the hint shows what a filter may use
    assert await conn.fetchval("select filter from ferry.subscriptions where name = 's'") == "$.ok == true"


async def test_the_api_and_the_cli_refuse_a_bad_filter_in_one_line(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry
) -> None:
    with pytest.raises(PgferryError, match="is not a predicate"):
        await ferry.subscribe("s", ["s"], "http://127.0.0.1:9/x", filter="$.amount")
    refused = await cli(pgferry_cmd, db_url, "subscription", "add", "s", "--url", "http://127.0.0.1:9/x",
                        "--stream", "s", "--filter", "$.amount >")  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "pgferry: filter '$.amount >' is not a valid jsonpath" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr  # with its hint, on one line
    saved = await cli(pgferry_cmd, db_url, "subscription", "add", "s", "--url", "http://127.0.0.1:9/x",
                      "--stream", "s", "--filter", "$.amount > 100")  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    listed = orjson.loads((await cli(pgferry_cmd, db_url, "subscription", "list", "--json")).stdout)
    assert [(s["name"], s["filter"]) for s in listed if s["name"] == "s"] == [("s", "$.amount > 100")]


async def test_replay_queues_only_the_events_the_filter_matches(
    relay: RunningRelay, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await ferry.subscribe("even", ["s"], url, filter="$.n % 2 == 0")
    ids = [await ferry.publish("s", {"n": n}) for n in range(6)]
    await _all_caught_up(conn, "even")
    assert delivered_ids(receiver) == set(ids[0::2])
    assert await conn.fetchval("select ferry.replay_count('even', from_event => $1)", ids[0]) == 3
    queued = await conn.fetchval("select sum(queued) from ferry.replay('even', from_event => $1)", ids[0])
    assert queued == 3
    assert {r["event_id"] for r in await conn.fetch("select event_id from ferry.retries")} == set(ids[0::2])


async def test_a_hand_made_update_cannot_store_a_filter_that_would_fail_every_read(conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.subscribe('s', array['s'], 'http://127.0.0.1:9/x')")
    for text in ("$.amount >", '$tenant == "acme"'):
        with pytest.raises(asyncpg.PostgresError):
            await conn.execute("update ferry.subscriptions set filter = $1 where name = 's'", text)
    assert await conn.fetchval("select filter from ferry.subscriptions where name = 's'") is None


async def test_migration_0031_disables_a_stored_filter_with_an_unknown_variable_and_says_why(
    conn: asyncpg.Connection,
) -> None:
    """A filter whose variable is reached only inside a filter expression passed the column's check
    (it evaluates on {}); stored before ferry._check_filter refused it, it failed every read."""
    for name in ("bad", "good"):
        await conn.execute("select ferry.subscribe($1, array['s'], 'http://127.0.0.1:9/x')", name)
    await conn.execute("update ferry.subscriptions set filter = 'exists($.items ? (@ > $min))' where name = 'bad'")
    await conn.execute(
        """update ferry.subscriptions set filter = '$key == "$min" && $.a == "$x"' where name = 'good'"""
    )
    (migration,) = [m for m in sql.migrations() if m.version == 31]
    await conn.execute(migration.sql)
    rows = await conn.fetch("select name, state, state_reason from ferry.subscriptions order by name")
    assert [(r["name"], r["state"]) for r in rows] == [("bad", "disabled"), ("good", "active")]
    assert rows[0]["state_reason"].startswith("its filter uses an unknown variable ($min)")
