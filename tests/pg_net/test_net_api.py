"""pg_net's SQL API on pgferry: same calls, same tables, but durable and retried."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import orjson
import pytest

from pgferry import db
from pgferry.errors import PgferryError
from pgferry.receiver import Action, Drop, Hang, Received, Respond
from pgferry.schema import install
from tests.helpers import MakeReceiver, RunningRelay
from tests.helpers import net_responses as responses


def base(url: str) -> str:
    return url.rsplit("/", 1)[0]


async def test_seed_trigger_from_a_pg_net_tutorial_runs_unchanged(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    hook = base(url) + "/api/spice-harvest"
    await net_conn.execute("create table spice_harvests (id serial primary key, harvester text, amount int)")
    await net_conn.execute(
        f"""
        CREATE OR REPLACE FUNCTION spice_harvests_webhook() RETURNS TRIGGER LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM net.http_post(url := '{hook}', body := to_jsonb(NEW),
                                headers := '{{"Content-Type": "application/json"}}'::jsonb);
          RETURN NEW;
        END; $$;
        CREATE TRIGGER spice_harvests_webhook AFTER INSERT ON spice_harvests
          FOR EACH ROW EXECUTE FUNCTION spice_harvests_webhook();
        """
    )
    await net_conn.execute(
        "insert into spice_harvests (harvester, amount) select 'h' || g, g from generate_series(1, 20) g"
    )
    rows = await responses(net_conn, 20)
    assert [r["status_code"] for r in rows] == [200] * 20
    assert all(r["error_msg"] is None and r["timed_out"] is False for r in rows)
    bodies = sorted((orjson.loads(r.body) for r in receiver.received), key=lambda b: b["id"])
    assert bodies[0] == {"id": 1, "harvester": "h1", "amount": 1}
    assert {r.path for r in receiver.received} == {"/api/spice-harvest"}
    assert receiver.received[0].headers["content-type"] == "application/json"


async def test_get_with_params_delete_with_and_without_body_and_headers(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    root = base(url)
    ids = [
        await net_conn.fetchval(
            'select net.http_get($1, \'{"foo1": "bar1", "encoded": "!", "sp ace": "a b/é"}\'::jsonb)',
            root + "/get",
        ),
        await net_conn.fetchval('select net.http_get($1, headers := \'{"API-KEY-HEADER": "k3y"}\'::jsonb)', root),
        await net_conn.fetchval("select net.http_delete($1)", root + "/delete/2"),
        await net_conn.fetchval('select net.http_delete($1, body := \'{"why": "gone"}\'::jsonb)', root + "/delete/3"),
    ]
    await responses(net_conn, 4)
    seen = {(r.method, r.path): r for r in receiver.received}
    # params in jsonb key order (shorter keys first), each part percent-encoded, as pg_net does
    assert ("GET", "/get?foo1=bar1&sp%20ace=a%20b%2F%C3%A9&encoded=%21") in seen
    assert seen[("GET", "/")].headers["api-key-header"] == "k3y"
    assert seen[("DELETE", "/delete/2")].body == b""
    assert orjson.loads(seen[("DELETE", "/delete/3")].body) == {"why": "gone"}
    assert ids == sorted(ids)


async def test_post_body_with_special_characters_and_content_type_rules(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    body = {"quote": 'it\'s "fine"', "newline": "a\nb", "emoji": "🌶", "nul-ish": "\\u0000", "key": 5}
    await net_conn.execute("select net.http_post($1, $2::jsonb)", url, orjson.dumps(body).decode())
    await responses(net_conn, 1)
    assert orjson.loads(receiver.received[0].body) == body
    with pytest.raises(asyncpg.PostgresError, match='Content-Type header must be "application/json"'):
        await net_conn.execute('select net.http_post($1, headers := \'{"content-type": "text/plain"}\')', url)


async def test_timeouts_unreachable_hosts_and_plain_text_answers(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    await net_conn.execute("update ferry.subscriptions set max_attempts = 1 where name = 'pg_net'")  # pg_net's way
    await asyncio.sleep(0.5)  # the relay picks up new settings on its next round (every 0.2 s here)
    _, slow = await receiver_factory(lambda _: Hang())
    _, text = await receiver_factory(lambda _: Respond(200, b"plain words", (("Content-Type", "text/plain"),)))
    timed = await net_conn.fetchval("select net.http_get($1, timeout_milliseconds := 300)", slow)
    refused = await net_conn.fetchval("select net.http_get('http://127.0.0.1:1/nothing-here')")
    plain = await net_conn.fetchval("select net.http_get($1)", text)
    rows = {r["id"]: r for r in await responses(net_conn, 3)}
    assert rows[timed]["timed_out"] is True and rows[timed]["error_msg"].startswith("Timeout of 300 ms reached")
    assert rows[timed]["status_code"] is None
    assert rows[refused]["error_msg"].startswith("Couldn't connect to server")
    assert (rows[plain]["status_code"], rows[plain]["content"], rows[plain]["content_type"]) == (
        200, "plain words", "text/plain",
    )  # fmt: skip
    assert orjson.loads(rows[plain]["headers"])["Content-Type"] == "text/plain"


async def test_rolled_back_request_is_never_sent(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    tx = net_conn.transaction()
    await tx.start()
    await net_conn.execute("select net.http_get($1 || '?rolled=back')", url)
    await tx.rollback()
    kept = await net_conn.fetchval("select net.http_get($1 || '?kept=yes')", url)
    await responses(net_conn, 1)
    await asyncio.sleep(0.5)
    assert [r.path for r in receiver.received] == ["/hook?kept=yes"]
    assert await net_conn.fetchval("select id from net._http_response") == kept


async def test_collect_response_sync_async_and_pending(
    net_db: str, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    _, url = await receiver_factory(lambda _: Respond(201, b'{"made": true}', (("Content-Type", "application/json"),)))
    request_id = await net_conn.fetchval("select net.http_get($1)", url)
    pending = await net_conn.fetchrow("select * from net._http_collect_response($1)", request_id)
    assert pending["status"] == "PENDING"  # queued, no relay yet
    missing = await net_conn.fetchrow("select * from net._http_collect_response(987654)")
    assert (missing["status"], missing["message"]) == ("ERROR", "request matching request_id not found")
    assert await net_conn.fetchval("select count(*) from net.http_request_queue") == 1

    relay = RunningRelay(net_db)
    try:
        waited = await net_conn.fetchrow(
            "select status, message, (response).status_code, (response).body "
            "from net._http_collect_response($1, async := false)",
            request_id,
        )
        assert tuple(waited) == ("SUCCESS", "ok", 201, '{"made": true}')
        body = await net_conn.fetchval(
            "select ((response).body::json)->>'made' from net._http_collect_response($1)", request_id
        )
        assert body == "true"
        deprecated = await net_conn.fetchval("select status from net.http_collect_response($1)", request_id)
        assert deprecated == "SUCCESS"
        assert await net_conn.fetchval("select count(*) from net.http_request_queue") == 0
    finally:
        await relay.stop()


async def test_waiting_in_the_same_transaction_is_refused_instead_of_hanging(
    net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    _, url = await receiver_factory()
    async with net_conn.transaction():
        request_id = await net_conn.fetchval("select net.http_get($1)", url)
        with pytest.raises(asyncpg.PostgresError, match="only sent after it commits"):
            await net_conn.fetchrow("select * from net._http_collect_response($1, false)", request_id)


async def test_failing_receiver_still_ends_with_200_for_every_request(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    rng = random.Random(3)

    def flaky(_: Received) -> Action:
        roll = rng.random()
        return Respond(500, b"boom") if roll < 0.1 else Drop() if roll < 0.15 else Respond()

    receiver, url = await receiver_factory(flaky)
    await net_conn.execute("update ferry.subscriptions set max_attempts = 50 where name = 'pg_net'")
    await asyncio.sleep(0.5)  # the relay picks up new settings on its next round (every 0.2 s here)
    await net_conn.execute("select net.http_post($1, jsonb_build_object('n', g)) from generate_series(1, 300) g", url)
    rows = await responses(net_conn, 300, timeout=60)
    assert [r["status_code"] for r in rows] == [200] * 300
    assert len({orjson.loads(r.body)["n"] for r in receiver.received}) == 300
    assert await net_conn.fetchval("select count(*) from ferry.attempt_history() where error_class is not null") > 0


async def test_supabase_database_webhook_trigger(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    receiver, url = await receiver_factory()
    await net_conn.execute("create table profiles (id int primary key, name text)")
    await net_conn.execute(
        f"""create trigger "profile-hook" after insert or update or delete on public.profiles for each row
            execute function supabase_functions.http_request('{url}', 'POST', '{{"Content-type":"application/json"}}',
                                                             '{{}}', '1000')"""
    )
    await net_conn.execute("insert into profiles values (1, 'paul')")
    await net_conn.execute("update profiles set name = 'muad''dib'")
    await net_conn.execute("delete from profiles")
    await responses(net_conn, 3)
    payloads = sorted(
        (orjson.loads(r.body) for r in receiver.received), key=lambda p: ["INSERT", "UPDATE", "DELETE"].index(p["type"])
    )
    assert payloads == [
        {"type": "INSERT", "table": "profiles", "schema": "public", "record": {"id": 1, "name": "paul"},
         "old_record": None},
        {"type": "UPDATE", "table": "profiles", "schema": "public", "record": {"id": 1, "name": "muad'dib"},
         "old_record": {"id": 1, "name": "paul"}},
        {"type": "DELETE", "table": "profiles", "schema": "public", "record": None,
         "old_record": {"id": 1, "name": "muad'dib"}},
    ]  # fmt: skip
    hooks = await net_conn.fetch("select hook_name, request_id from supabase_functions.hooks order by id")
    assert [h["hook_name"] for h in hooks] == ["profile-hook"] * 3 and all(h["request_id"] for h in hooks)
    with pytest.raises(asyncpg.PostgresError, match="method argument PUT is invalid"):
        await net_conn.execute(
            f"""create trigger bad after insert on profiles for each row
                execute function supabase_functions.http_request('{url}', 'PUT');
                insert into profiles values (2, 'x')"""
        )


async def test_bad_urls_get_pg_net_errors(net_conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.PostgresError, match='invalid URL "/malformed_url"'):
        await net_conn.execute("select net.http_get('/malformed_url')")
    with pytest.raises(asyncpg.PostgresError, match="Unsupported URL scheme"):
        await net_conn.execute("select net.http_get('ftp://example.com/x')")
    with pytest.raises(asyncpg.PostgresError, match='null value in column "url"'):
        await net_conn.execute("select net.http_get(null)")


async def test_install_refuses_a_foreign_net_schema(empty_db_url: str) -> None:
    conn = await db.connect(empty_db_url)
    try:
        await conn.execute("create schema net")
        with pytest.raises(PgferryError, match="not created by pgferry"):
            await install(conn, addons=["pg_net"])
        await conn.execute("drop schema net")
        assert "pg_net:0001_net" in await install(conn, addons=["pg_net"])
        assert await install(conn, addons=["pg_net"]) == []
    finally:
        await conn.close()


async def test_readme_examples_of_pg_net(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """pg_net's README snippets, with postman-echo.com replaced by a local receiver."""
    receiver, url = await receiver_factory(lambda _: Respond(200, b'{"args": {"foo1": "bar1"}, "key": "value"}'))
    root = base(url)
    await net_conn.execute("create table target_table (id int primary key, name text)")
    await net_conn.execute("insert into target_table values (1, 'a'), (2, 'b')")
    snippets = [
        f"SELECT net.http_get ('{root}/get?foo1=bar1&foo2=bar2') AS request_id;",
        f"""SELECT net.http_get('{root}/get',
               '{{"foo1": "bar1", "foo2": "bar2", "encoded": "!"}}'::JSONB) AS request_id;""",
        f"""SELECT net.http_get('{root}/get?foo1=bar1&foo2=bar2',
               headers := '{{"API-KEY-HEADER": "<API KEY>"}}'::JSONB) AS request_id;""",
        f"""SELECT net.http_post('{root}/post', '{{"key": "value", "key": 5}}'::JSONB,
               headers := '{{"API-KEY-HEADER": "<API KEY>"}}'::JSONB) AS request_id;""",
        f"""WITH selected_row AS (SELECT * FROM target_table LIMIT 1)
            SELECT net.http_post('{root}/post', to_jsonb(selected_row.*),
                                 headers := '{{"API-KEY-HEADER": "<API KEY>"}}'::JSONB) AS request_id
            FROM selected_row;""",
        f"""WITH selected_rows AS (SELECT jsonb_agg(to_jsonb(target_table)) AS JSON_payload FROM target_table)
            SELECT net.http_post('{root}/post'::TEXT, JSON_payload,
                                 headers := '{{"API-KEY-HEADER": "<API KEY>"}}'::JSONB) AS request_id
            FROM selected_rows;""",
        f"SELECT net.http_delete('{root}/api/v1/delete/2') AS request_id;",
        f"""WITH selected_id AS (SELECT id FROM target_table LIMIT 1)
            SELECT net.http_delete('{root}/api/v1/delete/'::TEXT, format('{{"id": "%s"}}', id)::JSONB) AS request_id
            FROM selected_id;""",
    ]
    ids = [await net_conn.fetchval(snippet) for snippet in snippets]
    rows = {r["id"]: r for r in await responses(net_conn, len(snippets))}
    assert all(rows[i]["status_code"] == 200 for i in ids)
    result = await net_conn.fetchrow(
        "SELECT *, ((response).body::JSON)->'args' AS args FROM net._http_collect_response($1);", ids[0]
    )
    assert result["status"] == "SUCCESS" and orjson.loads(result["args"]) == {"foo1": "bar1"}
    seen = {(r.method, r.path) for r in receiver.received}
    assert ("GET", "/get?foo1=bar1&foo2=bar2&encoded=%21") in seen
    assert ("DELETE", "/api/v1/delete/?id=1") in seen
    posts = [orjson.loads(r.body) for r in receiver.received if r.method == "POST"]
    assert {"key": 5} in posts and {"id": 1, "name": "a"} in posts
    assert [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}] in posts
    assert await net_conn.fetchval("SELECT count(*) FROM net._http_response WHERE status_code >= 500") == 0


async def test_expired_responses_are_pruned(net_conn: asyncpg.Connection) -> None:
    await net_conn.execute(
        "insert into net._http_response (id, status_code, created) values (1, 200, now() - interval '7 hours')"
    )
    await net_conn.execute("insert into net._http_response (id, status_code) values (2, 200)")
    done = await net_conn.fetchval("select ferry.housekeeping()")
    assert "pg_net: removed 1 expired net._http_response rows" in done
    assert [r["id"] for r in await net_conn.fetch("select id from net._http_response")] == [2]


async def test_queued_requests_survive_a_postgres_crash(receiver_factory: MakeReceiver) -> None:
    """pg_net's queue is UNLOGGED and empties on a crash; pgferry's is the WAL-logged log."""
    from pgferry.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings={"fsync": "on"})
    server.start()
    try:
        conn = await db.connect(server.url)
        await install(conn, addons=["pg_net"])
        receiver, url = await receiver_factory()
        ids = [
            await conn.fetchval("select net.http_post($1, jsonb_build_object('n', $2::int))", url, n) for n in range(3)
        ]
        await conn.close()
        await asyncio.to_thread(server.restart, "immediate")  # a crash: no shutdown checkpoint
        conn = await db.connect(server.url)
        assert await conn.fetchval("select count(*) from net.http_request_queue") == 3
        relay = RunningRelay(server.url)
        try:
            rows = await responses(conn, 3)
        finally:
            await relay.stop()
            await conn.close()
        assert [r["id"] for r in rows] == ids and {r["status_code"] for r in rows} == {200}
        assert sorted(orjson.loads(r.body)["n"] for r in receiver.received) == [0, 1, 2]
    finally:
        server.destroy()


async def test_foreign_events_in_the_request_stream_and_long_bodies(
    net_relay: RunningRelay, net_conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    big = b"y" * 300_000
    _, url = await receiver_factory(lambda _: Respond(200, big))
    # an event written to the request stream by other means is not a queued request: never sent
    bogus = await net_conn.fetchval("""select ferry.publish('net.http', '{"not": "a request"}')""")
    good = await net_conn.fetchval("select net.http_get($1)", url)
    rows = {r["id"]: r for r in await responses(net_conn, 1)}
    assert rows[good]["content"] == big.decode()  # the whole body, not the first network read
    assert bogus not in rows
    assert await net_conn.fetchval("select count(*) from ferry.attempt_history() where event_id = $1", bogus) == 0
    with pytest.raises(asyncpg.PostgresError, match="timeout_milliseconds must be between 1 and 600000"):
        await net_conn.execute("select net.http_get($1, timeout_milliseconds := 0)", url)
