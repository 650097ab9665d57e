"""Privileges: ferry_writer can only append (publish, capture, net.http_*); ferry_relay runs the relay.

Each test makes login roles that are members of one group role only, then
acts through them on real connections; what a role must not do is asserted
to fail with PostgreSQL's permission error (42501), never just assumed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import asyncpg
import pytest

import pgferry
from pgferry import api_tokens
from pgferry.api_tokens import TokenStore
from pgferry.errors import PermissionDenied
from pgferry.receiver import Respond
from tests.helpers import FAST, MakeReceiver, RunningRelay, cli, eventually

_n = itertools.count()


def as_role(url: str, role: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


async def login_role(admin: asyncpg.Connection, group: str) -> str:
    """A new login role (roles are cluster-wide: unique per test) that is a member of ``group`` only."""
    name = f"{group.removeprefix('ferry_')}_{os.getpid()}_{next(_n)}"
    await admin.execute(f"create role {name} login in role {group}")
    return name


@pytest.fixture
async def admin(net_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(net_db)
    yield conn
    await conn.close()


@pytest.fixture
async def writer(net_db: str, admin: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    name = await login_role(admin, "ferry_writer")
    # The writer's own table, captured by the administrator.
    await admin.execute(f"create table orders (id int primary key, total int); alter table orders owner to {name}")
    await admin.execute("select ferry.capture_table('orders')")
    conn = await asyncpg.connect(as_role(net_db, name))
    yield conn
    await conn.close()


async def test_a_writer_cannot_shut_net_http_off_for_every_session(
    admin: asyncpg.Connection, writer: asyncpg.Connection
) -> None:
    """Two ways a writer broke every session's net.http_* calls (outside probe): closing the
    stream, and queueing rows under request ids not drawn yet."""
    with pytest.raises(asyncpg.PostgresError, match=r"net\.http.* cannot be closed"):
        await writer.fetchval("select ferry.close_stream('net.http')")
    with pytest.raises(asyncpg.PostgresError, match="currval of sequence"):  # nothing drawn yet in this session
        await writer.execute("select net._queue_request(1, 'GET', 'http://x', null, null, 1000)")
    await writer.execute("select ferry.publish('mine', '{}')")
    upcoming = await admin.fetchval("select last_value + 1 from ferry.event_id_seq")
    with pytest.raises(asyncpg.PostgresError, match=r"queues only the request net\._enqueue has just published"):
        await writer.execute(
            "select net._queue_request(g, 'GET', 'http://x', null, null, 1000) from generate_series($1, $1 + 5) g",
            upcoming,
        )
    for _ in range(3):
        assert await writer.fetchval("select net.http_get('http://127.0.0.1:9/y')") >= upcoming
    assert await admin.fetchval("select count(*) from net.http_request_queue") == 3


async def test_writer_publishes_captures_and_uses_the_net_api(
    net_db: str, admin: asyncpg.Connection, writer: asyncpg.Connection
) -> None:
    first = await writer.fetchval("select ferry.publish('billing', '{\"invoice\": 1}', key => 'c-1')")
    many = await writer.fetch("select ferry.publish_many(array['billing', 'billing'], array['1', '2']::jsonb[])")
    async with writer.transaction():
        await writer.execute("insert into orders values (1, 10), (2, 20)")
        await writer.execute("update orders set total = 11 where id = 1")
        await writer.execute("delete from orders where id = 2")
    request = await writer.fetchval("select net.http_post('http://127.0.0.1:9/x', '{\"a\": 1}')")
    # a Supabase Database Webhook trigger on the writer's own table
    await admin.execute("create table hooked (id int primary key)")
    await admin.execute("alter table hooked owner to " + await writer.fetchval("select current_user"))
    await writer.execute(
        "create trigger hook after insert on hooked for each row "
        "execute function supabase_functions.http_request('http://127.0.0.1:9/hook', 'POST', '{}', '{}', '1000')"
    )
    await writer.execute("insert into hooked values (1)")
    # pg_net's way of looking at results works for a writer
    assert (await writer.fetchval("select (net._http_collect_response($1)).status::text", request)) == "PENDING"
    assert await writer.fetchval("select count(*) from net._http_response") == 0
    async with writer.transaction():
        made_now = await writer.fetchval("select net.http_get('http://127.0.0.1:9/y')")
        with pytest.raises(asyncpg.PostgresError, match="was made in this transaction"):
            await writer.fetchval("select net._http_collect_response($1, async => false)", made_now)

    rows = await admin.fetch("select id, stream, key, op::text as op from ferry.events order by id")
    assert [r["id"] for r in rows[:3]] == [first, *[m[0] for m in many]]
    captured = [(r["stream"], r["key"], r["op"]) for r in rows[3:7]]
    assert captured == [("public.orders", k, op) for k, op in (("1", "I"), ("2", "I"), ("1", "U"), ("2", "D"))]
    assert rows[7]["stream"] == "net.http" and rows[7]["id"] == request
    hook_request = await admin.fetchval("select request_id from supabase_functions.hooks")
    assert rows[8]["stream"] == "net.http" and rows[8]["id"] == hook_request
    # The Python API works for a writer too.
    async with pgferry.connect(as_role(net_db, await writer.fetchval("select current_user")), pool_size=1) as ferry:
        assert await ferry.publish("billing", {"invoice": 2}) > request


async def test_writer_writes_a_table_captured_with_filters_with_no_more_privileges(
    admin: asyncpg.Connection, writer: asyncpg.Connection
) -> None:
    """The filtered trigger functions run as the writer too (SECURITY INVOKER) and need nothing more."""
    await admin.execute(
        "select ferry.capture_table('orders', condition => 'total > 5 and abs(total) < 100', "
        "columns => array['total'], changed_columns => array['total'])"
    )
    await writer.execute("insert into orders values (1, 10), (2, 1)")
    await writer.execute("update orders set total = total + 1")
    await writer.execute("delete from orders")
    rows = await admin.fetch("select key, op::text as op, payload, old_payload from ferry.events order by id")
    assert [tuple(r) for r in rows] == [
        ("1", "I", '{"total": 10}', None),
        ("1", "U", '{"total": 11}', '{"total": 10}'),
        ("1", "D", '{"total": 11}', None),
    ]


FORBIDDEN_TO_WRITERS = [
    "select secrets from ferry.subscriptions",
    "select * from ferry.subscriptions",
    "select * from ferry.attempts",
    "select * from ferry.deliveries",
    "select * from ferry.dead_letters",
    "select * from ferry.retries",
    "select * from ferry.events",
    "select * from ferry.events_0",
    "select * from ferry.consumers",
    "select * from ferry.captures",
    "select * from ferry.relays",
    "select * from net.http_request_queue",
    "select * from ferry.subscription_status()",
    "select * from ferry.batch_events(1, 2)",
    "select * from ferry.next_batch('webhook:pg_net')",
    "select ferry.subscribe('mine', array['billing'], 'http://127.0.0.1:9/x')",
    "select ferry.set_subscription_secrets('pg_net', array['whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'])",
    "select ferry.dlq_replay('pg_net')",
    "select ferry.register_consumer('spy', null, 'beginning')",
    "select ferry.tick()",
    "select ferry.capture_table('orders')",
    "select ferry.capture_table('orders', condition => 'total > 0')",
    "select ferry._capture_condition('orders', 'total > 0')",
    "select ferry._record_expression(1, 'r')",
    "select ferry._key_expression(1, 'r')",
    # a backfill's condition runs with its runner's rights: a writer must not be able to plant one
    "select ferry.backfill('orders', condition => 'true')",
    "select * from ferry.backfill_chunk(1)",
    "select ferry.backfill_cancel(1)",
    "select * from ferry.backfills",
    "update ferry.backfills set condition = 'true'",
    "select * from ferry.streams",
    "select ferry._unknown_streams(array['billing'])",
    "select ferry._catalog_streams()",
    "select * from ferry.api_tokens",
    "select ferry.token_create('mine', sha256('x'), array['*'], array['*'])",
    "select ferry.token_revoke('reader')",
    "update ferry.api_tokens set last_used_at = now()",
    "update ferry.subscriptions set url = 'http://127.0.0.1:9/steal'",
    "delete from net._http_response",
    # forging the commit-order columns of the log
    "insert into ferry.events_0 (part, txid, stream, payload) values (0, '1', 's', '{}')",
    "insert into ferry.events_0 (id, part, stream, payload) values (1, 0, 's', '{}')",
    "insert into ferry.events (part, stream, payload) values (0, 's', '{}')",
    "truncate ferry.events_0",
    "select setval('ferry.current_partition_seq', 1)",
]


async def test_writer_cannot_read_secrets_history_or_other_consumers_data(
    admin: asyncpg.Connection, writer: asyncpg.Connection
) -> None:
    await admin.execute(
        "select ferry.subscribe('other', array['billing'], 'http://127.0.0.1:9/x', "
        "secret => 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3')"
    )
    allowed = []
    for statement in FORBIDDEN_TO_WRITERS:
        try:
            await writer.execute(statement)
            allowed.append(statement)
        except asyncpg.InsufficientPrivilegeError:
            pass
    assert allowed == []


async def test_relay_role_subscribes_and_hears_which_streams_nothing_has_written(
    net_db: str, admin: asyncpg.Connection, writer: asyncpg.Connection
) -> None:
    """subscribe and housekeeping, replaced by migration 0008, still work for ferry_relay alone."""
    relay = await asyncpg.connect(as_role(net_db, await login_role(admin, "ferry_relay")))
    heard: list[asyncpg.PostgresLogMessage] = []
    relay.add_log_listener(lambda _, message: heard.append(message))
    try:
        await relay.execute(
            "select ferry.subscribe('mine', array['public.orders', 'net.http', 'public.ordrs'], 'http://127.0.0.1:9/x')"
        )
        await writer.execute("select ferry.publish('billing', '{}')")
        await relay.fetchval("select ferry.tick()")  # the catalog goes up to the newest tick
        await relay.fetchval("select ferry.housekeeping()")
        assert await relay.fetchval("select array_agg(stream) from ferry.streams") == ["billing"]
    finally:
        await relay.close()
    assert [(m.sqlstate, m.message) for m in heard] == [
        ("01PF1", 'pgferry: no events have been written to stream "public.ordrs" yet')
    ]


async def test_relay_role_reads_api_tokens_and_notes_their_use_but_cannot_make_or_change_them(
    net_db: str, admin: asyncpg.Connection, pgferry_cmd: list[str]
) -> None:
    """The relay authorizes API requests with ferry_relay alone; minting, reviving or widening a
    token takes the installer's role."""
    token = await api_tokens.create(admin, "reader", ["orders.*"], [])
    await api_tokens.create(admin, "old", ["*"], ["*"])
    await api_tokens.revoke(admin, "old")
    role = await login_role(admin, "ferry_relay")
    relay = await asyncpg.connect(as_role(net_db, role))
    try:
        store = TokenStore(relay)
        assert (await store.authorize(token, "orders.eu", "read")).allowed
        await store.refresh()  # notes the use
        assert await admin.fetchval("select last_used_at is not null from ferry.api_tokens where name = 'reader'")
        for statement in (
            "select ferry.token_create('mine', sha256('x'), array['*'], array['*'])",
            "select ferry.token_revoke('reader')",
            "insert into ferry.api_tokens (name, token_hash, read_patterns) values ('mine', sha256('x'), '{*}')",
            "update ferry.api_tokens set revoked_at = null",
            "update ferry.api_tokens set read_patterns = '{*}', write_patterns = '{*}'",
            "update ferry.api_tokens set token_hash = sha256('x') where name = 'reader'",
            "delete from ferry.api_tokens",
            "truncate ferry.api_tokens",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await relay.execute(statement)
    finally:
        await relay.close()
    done = await cli(pgferry_cmd, as_role(net_db, role), "token", "create", "mine", "--read", "*")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "Error: permission denied for table api_tokens: creating and revoking API tokens takes the role that "
        "installed pgferry (ferry_relay may only read them), or one it granted INSERT and UPDATE on ferry.api_tokens\n"
    )
    assert await admin.fetchval("select count(*) from ferry.api_tokens") == 2


async def test_publish_ignores_a_hostile_search_path(net_db: str, admin: asyncpg.Connection) -> None:
    """publish runs as its owner; a caller's search_path must not be able to swap a function it calls."""
    name = await login_role(admin, "ferry_writer")
    await admin.execute(f"create schema evil authorization {name}")
    writer = await asyncpg.connect(as_role(net_db, name))
    try:
        await writer.execute(
            "create function evil.btrim(text) returns text language plpgsql as "
            "$$ begin raise exception 'hijacked as %', current_user; end $$;"
            "set search_path = evil, pg_catalog"
        )
        assert await writer.fetchval("select ferry.publish('s', '{}')") > 0
        # The control: without the pinned search_path, the same call runs the caller's function as the owner.
        await admin.execute("alter function ferry.publish(text, jsonb, text, jsonb) reset search_path")
        with pytest.raises(asyncpg.PostgresError, match="hijacked as postgres"):
            await writer.fetchval("select ferry.publish('s', '{}')")
    finally:
        await writer.close()


#: Overloads a writer may plant in public (any role may create there before PostgreSQL 15): each
#: matches a call better than pg_catalog's variadic function, notes who ran it, and does its job.
PLANTED = [
    ("format", "f text, a text", "pg_catalog.format(f, a)", "text"),
    ("format", "f text, a text, b text", "pg_catalog.format(f, a, b)", "text"),
    ("format", "f text, a integer", "pg_catalog.format(f, a)", "text"),
    ("format", "f text, a bigint", "pg_catalog.format(f, a)", "text"),
    ("jsonb_build_object", "a text, b text", "pg_catalog.jsonb_build_object(a, b)", "jsonb"),
    ("concat", "a text, b text", "pg_catalog.concat(a, b)", "text"),
]


async def test_the_relay_never_runs_functions_a_writer_planted_in_public(
    net_db: str, admin: asyncpg.Connection, writer: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """The relay's sessions search pg_catalog only: with public on their path, a writer's
    public.format(text, text, text) ran as the relay's role and read every signing secret (outside probe)."""
    writer_role = await writer.fetchval("select current_user")
    await admin.execute(f"grant create on schema public to {writer_role}")
    await writer.execute(
        "create table public.planted_calls (role text, app text); grant insert on planted_calls to public"
    )
    for name, params, body, returns in PLANTED:
        await writer.execute(
            f"create function public.{name}({params}) returns {returns} language sql volatile as $$"
            f" insert into public.planted_calls values (current_user, current_setting('application_name'));"
            f" select {body} $$; grant execute on function public.{name}({params}) to public"
        )
    await admin.execute("select format('%s', 'x'::text)")  # the control: a session with public on its path
    assert await admin.fetchval("select count(*) from planted_calls where role = 'postgres'") == 1
    await admin.execute("truncate planted_calls")

    relay_role = await login_role(admin, "ferry_relay")
    good, good_url = await receiver_factory()
    _, bad_url = await receiver_factory(lambda _: Respond(500, b"no"))
    await admin.execute("select ferry.subscribe('good', array['public.orders', 'billing'], $1, secret => $2)",
                        good_url, "whsec_" + "A" * 32)  # fmt: skip
    await admin.execute("select ferry.subscribe('bad', array['billing'], $1, max_attempts => 2, retry_base_ms => 10)",
                        bad_url)  # fmt: skip
    await admin.execute("update ferry.config set rotation_interval = '0', idle_tick_interval = '100 ms'")
    relay = RunningRelay(as_role(net_db, relay_role), replace(FAST, dashboard_port=0, metrics_port=0))
    try:
        await writer.execute("insert into orders select g, g from generate_series(1, 5) g")
        await writer.execute("update orders set total = total + 1")
        await writer.execute("select ferry.publish('billing', '{\"n\": 1}')")

        async def done() -> bool:
            dead = await admin.fetchval("select count(*) from ferry.dead_letters where subscription = 'bad'")
            return len(good.received) == 11 and dead == 1

        await eventually(done, timeout=20, what="deliveries and a dead letter")
        async with aiohttp.ClientSession() as session:  # the dashboard's and the metrics' sessions too
            for what in ("dashboard", "metrics"):
                async with session.get(relay.relay.addresses[what]) as r:
                    assert r.status == 200
    finally:
        await relay.stop()
    ran = await admin.fetch("select distinct role, app from planted_calls where app like 'pgferry %'")
    assert [tuple(r) for r in ran] == []


async def test_relay_runs_with_only_ferry_relay(
    net_db: str,
    admin: asyncpg.Connection,
    writer: asyncpg.Connection,
    receiver_factory: MakeReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay_role = await login_role(admin, "ferry_relay")
    good, good_url = await receiver_factory()
    _, bad_url = await receiver_factory(lambda _: Respond(500, b"no"))
    await admin.execute("select ferry.subscribe('good', array['public.orders', 'billing'], $1)", good_url)
    await admin.execute(
        "select ferry.subscribe('bad', array['billing'], $1, max_attempts => 2, retry_base_ms => 10)", bad_url
    )
    # rotate, truncate and prune as fast as possible, so the relay must do all of it
    await admin.execute(
        "update ferry.config set rotation_interval = '0', attempts_retention = '0', idle_tick_interval = '100 ms'"
    )
    caplog.set_level(logging.INFO)
    relay = RunningRelay(as_role(net_db, relay_role))
    try:
        await writer.execute("insert into orders select g, g from generate_series(1, 5) g")
        await writer.execute("select ferry.publish('billing', '{\"n\": 1}')")
        request = await writer.fetchval("select net.http_get($1)", good_url)

        async def done() -> bool:
            return (
                len(good.received) == 7
                and await admin.fetchval("select count(*) from ferry.dead_letters where subscription = 'bad'") == 1
                and await admin.fetchval("select count(*) from net._http_response where id = $1", request) == 1
            )

        await eventually(done, timeout=20, what="deliveries, a dead letter and a pg_net response")
        sessions = await admin.fetch("select usename::text from pg_stat_activity where datname = current_database()")
        assert relay_role in {r[0] for r in sessions}  # really the relay role at work
        assert (await writer.fetchval("select (net._http_collect_response($1)).status::text", request)) == "SUCCESS"

        async def housekeeping() -> bool:
            text = caplog.text
            return "truncated" in text and "old delivery attempts" in text

        await eventually(housekeeping, timeout=20, what="rotation, truncation and attempt pruning by the relay role")
    finally:
        await relay.stop()
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or "permission" in r.getMessage()]
    assert problems == []


async def test_a_writer_closes_its_stream_and_read_stream_as_a_writer_names_the_grant_it_needs(
    net_db: str, admin: asyncpg.Connection
) -> None:
    """read_stream as a role in ferry_writer only failed with a raw InsufficientPrivilegeError
    (permission denied for table closed_streams; outside probe)."""
    writer = await login_role(admin, "ferry_writer")
    async with pgferry.connect(as_role(net_db, writer)) as ferry:
        await ferry.publish("chat:1", {"n": 1})
        assert await ferry.close_stream("chat:1") > 0  # writers may close streams (docs/security.md)
        with pytest.raises(PermissionDenied) as refused:
            async for _ in ferry.read_stream("chat:1"):
                pass
    assert str(refused.value).startswith("permission denied for ")
    assert "reading a stream reads the log, which takes the ferry_relay role" in str(refused.value)
    assert "`grant ferry_relay to` the role of the database URL" in str(refused.value)


async def test_commands_without_ferry_relay_say_in_one_line_which_grant_is_missing(
    net_db: str, admin: asyncpg.Connection, pgferry_cmd: list[str], tmp_path: Path
) -> None:
    """A role without ferry_relay (none at all, or only ferry_writer) gets one line naming the
    refusal and the grant, from the operator commands and the relay alike; install says who may."""
    nothing = f"nothing_{os.getpid()}_{next(_n)}"
    await admin.execute(f"create role {nothing} login")
    writer = await login_role(admin, "ferry_writer")
    plan = tmp_path / "pgferry.toml"
    plan.write_text('[subscriptions.x]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n')
    cases = [
        (nothing, ("status",), "schema ferry"),
        (nothing, ("run", "--processes", "1", "--exit-after", "20"), "schema ferry"),
        (writer, ("run", "--processes", "2", "--exit-after", "20"), "table config"),
        (writer, ("subscription", "pause", "x"), "table subscriptions"),
        (writer, ("dlq", "list"), "table dead_letters"),
        (writer, ("tail", "s", "--timeout", "20"), "table relays"),  # asked first: is a relay running?
        (writer, ("apply", str(plan)), "table subscriptions"),
        (writer, ("token", "list"), "table api_tokens"),
    ]
    limit = asyncio.Semaphore(4)

    async def run(role: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        async with limit:
            return await cli(pgferry_cmd, as_role(net_db, role), *args)

    results = await asyncio.gather(*(run(role, args) for role, args, _ in cases))
    for (role, args, what), done in zip(cases, results, strict=True):
        assert (done.returncode, done.stderr) == (
            1,
            f"Error: permission denied for {what}; role {role} needs ferry_relay: "
            f"`grant ferry_relay to {role}` (docs/security.md, Privileges)\n",
        ), args
    # A backfill reads the captured table as its caller: with ferry_relay but no rights on the
    # application's schema it was told to grant ferry_relay, which it had (outside probe).
    relay_role = await login_role(admin, "ferry_relay")
    await admin.execute("create schema shop")
    await admin.execute("create table shop.items (id int primary key)")
    await admin.execute("select ferry.capture_table('shop.items')")
    backfill = await cli(pgferry_cmd, as_role(net_db, relay_role), "backfill", "shop.items")
    assert backfill.returncode == 1 and "Traceback" not in backfill.stderr, backfill.stderr
    assert f"role {relay_role} may not read the application's schema shop" in backfill.stderr, backfill.stderr
    assert f"grant usage on schema ... to {relay_role}; grant select on ... to {relay_role}" in backfill.stderr
    assert "needs ferry_relay" not in backfill.stderr
    install = await cli(pgferry_cmd, as_role(net_db, writer), "install")
    assert install.returncode == 1 and install.stderr.startswith("Error: permission denied for database ")
    assert "installing takes a role that may create a schema" in install.stderr and "Traceback" not in install.stderr
