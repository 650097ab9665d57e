"""The SQL contract lives in files, and upgrading a released database keeps its data and ends
in exactly the schema a fresh install has."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from pathlib import Path

import asyncpg
import orjson
import pytest

from pgferry import db, sql
from pgferry.embedded import EmbeddedPostgres
from pgferry.errors import PgferryError
from pgferry.receiver import Receiver, Respond
from pgferry.schema import GENERATED, install, install_at
from tests.helpers import RunningRelay, eventually
from tests.sql import releases
from tests.sql.releases import NEWEST, RELEASES, Release, catalog, install_release

_DEFINED = re.compile(r"^create\s+or\s+replace\s+function\s+(\w+)\.(\w+)\s*\(", re.IGNORECASE | re.MULTILINE)
#: What a migration must not create: `create [or replace] [constraint] [materialized] function|...`,
#: in SQL or in a string that dynamic SQL runs.
_CREATES = re.compile(
    r"\bcreate\s+(?:or\s+replace\s+)?(?:temp(?:orary)?\s+|constraint\s+|materialized\s+|recursive\s+)?"
    r"(?:function|procedure|view|trigger)\b",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"--[^\n]*")


@pytest.fixture
async def nobody_role(pg: EmbeddedPostgres) -> None:
    """A role with no grants, standing for PUBLIC in privilege comparisons."""
    conn = await asyncpg.connect(pg.url)
    try:
        await conn.execute(
            "do $$ begin create role pgferry_nobody nologin; exception when duplicate_object then null; end $$"
        )
    finally:
        await conn.close()


def _defined_by_files() -> Counter[str]:
    """schema.name -> how many overloads the function files define."""
    found: Counter[str] = Counter()
    for addon in (None, *sql.ADDONS):
        for function in sql.functions(addon):
            found.update(f"{schema}.{name}" for schema, name in _DEFINED.findall(function.sql))
    return found


async def _installed(conn: asyncpg.Connection) -> Counter[str]:
    rows = await conn.fetch(
        """select n.nspname || '.' || p.proname as name from pg_proc p join pg_namespace n on n.oid = p.pronamespace
           where n.nspname in ('ferry', 'net', 'supabase_functions') and p.proname !~ $1""",
        GENERATED,
    )
    return Counter(r["name"] for r in rows)


async def test_every_installed_function_is_defined_by_exactly_one_file_and_nothing_else_is_left(
    empty_db_url: str,
) -> None:
    conn = await db.connect(empty_db_url)
    try:
        await install(conn, addons=["pg_net"])
        assert await _installed(conn) == _defined_by_files()
    finally:
        await conn.close()


def test_each_file_defines_the_function_it_is_named_after_and_calls_come_first() -> None:
    for addon in (None, *sql.ADDONS):
        order = [f.name for f in sql.functions(addon)]
        for position, function in enumerate(sql.functions(addon)):
            assert function.defines == {function.name}
            assert all(order.index(c) < position for c in function.calls if c in order), function.name


def test_no_migration_creates_a_function_procedure_view_or_trigger() -> None:
    """They live in sql/functions/ (triggers beside their function), re-applied on every install;
    a migration may only drop one that went away."""
    for addon in (None, *sql.ADDONS):
        for migration in sql.migrations(addon):
            found = _CREATES.findall(_COMMENT.sub("", migration.sql))
            assert not found, f"{addon or 'core'} migration {migration.version:04d}_{migration.name} creates {found}"


def test_no_migration_was_edited_after_it_shipped() -> None:
    """Every migration, core and add-on, is byte for byte what it was when it was committed
    (migrations.sha256): a database that applied it never applies it again, so a change to it
    reached fresh installs only (0035 was edited 50 minutes after it was committed, and databases
    installed in between kept its first index; outside probe). Change the schema in a new numbered
    migration and add its line; the frozen releases are checked against the same sums."""
    listed: dict[tuple[str, str], str] = {}
    for line in (Path(__file__).parent / "migrations.sha256").read_text().splitlines():
        if line and not line.startswith("#"):
            where, digest, name = line.split()
            listed[(where, name)] = digest
    current = {
        (addon or "core", f"{m.version:04d}_{m.name}.sql"): hashlib.sha256(m.sql.encode()).hexdigest()
        for addon in (None, *sql.ADDONS)
        for m in sql.migrations(addon)
    }
    assert current.keys() - listed.keys() == set(), "new migrations: add their lines to migrations.sha256"
    assert listed.keys() - current.keys() == set(), "a migration that shipped is gone"
    edited = sorted(f"{where} {name}" for (where, name), digest in current.items() if listed[(where, name)] != digest)
    assert not edited, f"migrations edited after they shipped: {edited}"
    for addon, shipped in ((None, NEWEST.core), *((a, NEWEST.pg_net) for a in sql.ADDONS)):
        frozen = releases.migrations(NEWEST, addon)
        assert len(frozen) == shipped, f"released/{NEWEST}: {len(frozen)} {addon or 'core'} migrations, not {shipped}"
        for path in frozen:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[(addon or "core", path.name)], path


async def _fresh_catalog(url: str) -> dict[str, object]:
    conn = await db.connect(url)
    try:
        await install(conn, addons=["pg_net"])
        return await catalog(conn)
    finally:
        await conn.close()


@pytest.mark.parametrize("release", RELEASES, ids=str)
@pytest.mark.usefixtures("nobody_role")
async def test_a_released_database_upgrades_to_the_fresh_schema_and_keeps_delivering(
    release: Release, empty_db_url: str, db_url: str
) -> None:
    """Data of every kind written by the released code (events before and after a subscription's
    cursor, a parked retry, a dead letter, a captured table, a queued pg_net request) is
    delivered after `pgferry install` with the current code, and the upgraded schema is, object
    for object and privilege for privilege, the one a fresh install makes."""
    receiver = Receiver(lambda _: Respond(200, b"ok"))
    url = await receiver.start()
    conn = await db.connect(empty_db_url)
    try:
        await install_release(conn, release)
        # what the released code wrote, with its own functions
        await conn.execute("create table orders (id int primary key, item text)")
        await conn.execute("select ferry.capture_table('orders')")
        await conn.execute("insert into orders values (1, 'before')")
        early = await conn.fetchval("""select ferry.publish('s', '{"n": "early"}')""")
        await conn.execute("select ferry.tick(true)")
        await conn.execute(
            "select ferry.subscribe('hook', array['s', 'public.orders'], $1, start_at => 'beginning')", url
        )
        later = await conn.fetchval("""select ferry.publish('s', '{"n": "later"}')""")
        for table, extra in (("retries", ", next_attempt_at"), ("dead_letters", "")):
            await conn.execute(
                f"insert into ferry.{table} (subscription, event_id, stream, key, payload, event_created_at, attempts,"
                f" first_failed_at{extra}) values ('hook', $1, 's', null, $2::text::jsonb, now(), 1, now()"
                f"{', now()' if extra else ''})",
                900_000 + len(table), orjson.dumps({"n": table}).decode(),
            )  # fmt: skip
        request = await conn.fetchval("select net.http_get($1)", url + "?pg_net=1")

        assert await install(conn)  # the current code: pending migrations, every function file
        assert await catalog(conn) == await _fresh_catalog(db_url)
        assert await _installed(conn) == _defined_by_files()

        await conn.execute("insert into orders values (2, 'after')")
        relay = RunningRelay(empty_db_url)
        try:
            await conn.execute("select ferry.dlq_replay('hook')")

            def bodies() -> list[object]:
                return [orjson.loads(r.body) for r in receiver.received if r.path == "/hook"]

            async def delivered() -> bool:
                return len(bodies()) >= 6

            await eventually(delivered, timeout=30, what="every kind of old data delivered")
            got = bodies()
            assert {"n": "early"} in got and {"n": "later"} in got  # the log, before and after the cursor
            assert {"n": "retries"} in got and {"n": "dead_letters"} in got  # parked and dead-lettered
            rows = sorted(g["record"]["item"] for g in got if isinstance(g, dict) and g.get("table") == "orders")
            assert rows == ["after", "before"]  # captured by the released trigger, and after the upgrade

            async def answered() -> bool:
                return bool(await conn.fetchval("select count(*) from net._http_response where id = $1", request))

            await eventually(answered, what="the queued pg_net request answered")
            assert early and later
        finally:
            await relay.stop()
    finally:
        await conn.close()
        await receiver.stop()


async def test_an_install_puts_back_a_function_edited_by_hand(db_url: str) -> None:
    """Every install re-applies every function file, migrations pending or not: what runs is what
    the files say, whatever was done to the database by hand."""
    conn = await db.connect(db_url)
    definition = "select pg_get_functiondef('ferry.tick(boolean)'::regprocedure)"
    try:
        fresh = await conn.fetchval(definition)
        await conn.execute(
            "create or replace function ferry.tick(force boolean default false) returns bigint"
            " language sql as $$ select null::bigint $$"
        )
        assert await conn.fetchval(definition) != fresh
        assert await install(conn) == []  # no migration pending
        assert await conn.fetchval(definition) == fresh
    finally:
        await conn.close()


def test_the_contract_index_lists_every_function_file() -> None:
    index = (Path(sql.__file__).parent / "functions" / "README.md").read_text()
    for addon in (None, *sql.ADDONS):
        for function in sql.functions(addon):
            assert f"`{function.name}" in index, f"{function.name} is missing from sql/functions/README.md"


async def test_only_the_functions_meant_for_them_run_with_their_owner_s_rights_for_public_and_writers(
    db_url: str,
) -> None:
    """SECURITY DEFINER functions are the ones a caller could use to reach past its own privileges:
    each is on this list, and PUBLIC may execute only the yes/no helpers of the pg_net API."""
    conn = await db.connect(db_url)
    try:
        await install(conn, addons=["pg_net"])
        rows = await conn.fetch(
            """select n.nspname || '.' || p.proname as name,
                      has_function_privilege('public', p.oid, 'execute') as public,
                      has_function_privilege('ferry_writer', p.oid, 'execute') as writer
               from pg_proc p join pg_namespace n on n.oid = p.pronamespace
               where n.nspname in ('ferry', 'net', 'supabase_functions') and p.prosecdef order by 1"""
        )
    finally:
        await conn.close()
    assert {r["name"]: (r["public"], r["writer"]) for r in rows} == {
        "ferry.close_stream": (False, True),
        "ferry.publish": (False, True),
        "ferry.publish_many": (False, True),
        "net._cancel_requests": (False, False),
        "net._queue_request": (False, True),
        "net._request_in_this_transaction": (True, True),
        "net._request_is_queued": (True, True),
        "net.check_worker_is_up": (True, True),
        "net.wait_until_running": (True, True),
    }


async def test_an_install_past_0016_waits_until_the_relays_of_older_code_are_stopped(empty_db_url: str) -> None:
    """Relays of code before migration 0016 call ferry.webhook_step, which it replaces: left
    running through the install, they failed every delivery, and a batch sent as it committed went
    out twice (outside probe). Connected relays hold the presence lock; a schema that old means
    they run code that old. A schema past 0016 keeps older relays working: no refusal then."""
    conn = await db.connect(empty_db_url)
    relay = await db.connect(empty_db_url)
    try:
        await install_release(conn, releases.release("36d660b"))
        await conn.execute("insert into ferry.relays (id, hostname, pid) values ('r1', 'old-host', 4242)")
        await relay.execute("select pg_advisory_lock_shared(28774, 3)")  # what its ownership session holds
        with pytest.raises(PgferryError, match=r"1 relay\(s\) are connected \(old-host:4242\), running code of "
                                               r"schema version 8: from migration 0016 on") as refused:  # fmt: skip
            await install_at(empty_db_url)
        assert "Stop them, run `pgferry install` again" in str(refused.value)
        assert await conn.fetchval("select max(version) from ferry.schema_migrations") == 8  # nothing applied
        await relay.execute("select pg_advisory_unlock_all()")
        assert await install_at(empty_db_url)
        await relay.execute("select pg_advisory_lock_shared(28774, 3)")  # a relay of this code
        assert await install_at(empty_db_url) == []
    finally:
        await relay.close()
        await conn.close()


@pytest.mark.usefixtures("nobody_role")
async def test_an_older_install_over_a_newer_schema_is_refused_and_changes_nothing(db_url: str) -> None:
    """An older pgferry's install over a newer schema said "already up to date", put its older
    functions back under the relays, and left overloads that made `ferry.backfill_resume` "not
    unique" (outside probe). Played here by a schema (and an add-on) one migration ahead."""
    conn = await db.connect(db_url)
    try:
        await install_at(db_url, addons=["pg_net"])
        before = await catalog(conn)
        latest = sql.latest_version()
        await conn.execute("insert into ferry.schema_migrations (version, name) values ($1, 'from_the_future')",
                           latest + 1)  # fmt: skip
        with pytest.raises(PgferryError, match=rf"installed by a newer pgferry \(the schema at version {latest + 1};"
                                               rf" this pgferry knows {latest}\).*Nothing was changed"):  # fmt: skip
            await install_at(db_url)
        await conn.execute("delete from ferry.schema_migrations where version = $1", latest + 1)
        newest = sql.migrations("pg_net")[-1].version
        await conn.execute("insert into ferry.addon_migrations (addon, version, name) values ('pg_net', $1, 'x')",
                           newest + 1)  # fmt: skip
        with pytest.raises(PgferryError, match=rf"its pg_net add-on at version {newest + 1}"):
            await install_at(db_url)
        await conn.execute("delete from ferry.addon_migrations where version = $1", newest + 1)
        assert await catalog(conn) == before
    finally:
        await conn.close()


async def test_an_install_drops_the_overloads_no_file_defines_and_redefines_a_renamed_parameter(db_url: str) -> None:
    """Outside probes: an older install left `ferry.backfill_resume(integer)` beside the file's
    `(bigint, integer)`, so `select ferry.backfill_resume(1)` was "not unique", and no install took
    it away; a parameter renamed in a file made every install of a database that had the old name
    fail ("cannot change name of input parameter"), for good."""
    conn = await db.connect(db_url)
    try:
        await conn.execute("create table items (id int primary key)")
        await conn.execute("select ferry.capture_table('items')")
        await conn.execute("create function ferry.backfill_resume(backfill integer) returns text language sql "
                           "as $$ select 'stale' $$")  # fmt: skip
        await conn.execute("create function ferry.gone_since(n int) returns int language sql as 'select n'")
        await conn.execute("drop function ferry._full_xid(bigint, xid8)")  # as the older file named it:
        await conn.execute("create function ferry._full_xid(newer bigint, near xid8) returns xid8 "
                           "language sql immutable as $$ select near $$")  # fmt: skip
        await install_at(db_url)
        assert await conn.fetchval("select to_regproc('ferry.gone_since')") is None
        assert await conn.fetchval("select count(*) from pg_proc where proname = 'backfill_resume'") == 1
        assert await conn.fetchval("select proargnames[1] from pg_proc where proname = '_full_xid'") == "low"
        await conn.execute("insert into items values (1)")  # the generated capture functions stay
        assert await conn.fetchval("select count(*) from ferry.events") == 1
        with pytest.raises(asyncpg.UndefinedObjectError, match="backfill 1 does not exist"):
            await conn.execute("select ferry.backfill_resume(1)")  # one function: the file's
    finally:
        await conn.close()


async def test_an_upgrade_regenerates_the_trigger_captures_an_earlier_pgferry_generated(empty_db_url: str) -> None:
    """The code capture_table generates per table is data: an install replaced the function files and
    left it. A table with a column named r captured by release 36d660b went on writing r's value as
    the whole record, and one with a column n failed every UPDATE, after the upgrade (outside probe)."""
    conn = await db.connect(empty_db_url)
    try:
        await install_release(conn, releases.release("36d660b"))
        await conn.execute("create table t_r (id int primary key, r int, o int)")
        await conn.execute("create table t_n (id int primary key, n int)")
        await conn.execute("select ferry.capture_table('t_r'), ferry.capture_table('t_n')")
        # renamed and moved since: found by oid (a lookup by the recorded name skipped them silently)
        await conn.execute("create schema app; alter table t_r set schema app; alter table t_n rename to t_n2")
        await install_at(empty_db_url)
        await conn.execute("insert into app.t_r values (7, 70, 700)")
        await conn.execute("insert into t_n2 values (1, 1)")
        await conn.execute("update t_n2 set n = 2")
        rows = await conn.fetch("select payload, old_payload from ferry.events order by id")
        assert [(r["payload"], r["old_payload"]) for r in rows] == [
            ({"id": 7, "r": 70, "o": 700}, None),
            ({"id": 1, "n": 1}, None),
            ({"id": 1, "n": 2}, {"id": 1, "n": 1}),
        ]
        assert await install_at(empty_db_url) == []  # and once only: the next install regenerates nothing
        marks = await conn.fetchval(
            "select count(*) from pg_description "
            "where description like '%(generator ' || ferry._capture_generator() || ')'"
        )
        assert marks == 6  # two tables, three operations each
    finally:
        await conn.close()


async def test_an_upgrade_keys_a_capture_by_its_primary_key_without_its_include_columns(empty_db_url: str) -> None:
    """Captures made before 0040 were keyed by a primary key's INCLUDE columns too; the upgrade
    corrects their key_columns, regenerates their trigger code with it, and a paused backfill goes
    on where it stood."""
    conn = await db.connect(empty_db_url)
    try:
        await install_release(conn, NEWEST)
        for t in ("t", "w"):
            await conn.execute(f"create table {t} (id int, v int, primary key (id) include (v))")
            await conn.execute(f"insert into {t} values (1, 1), (2, 2)")
        await conn.execute("select ferry.capture_table('w', method => 'wal')")
        await conn.execute("select ferry.capture_table('t')")
        backfill = await conn.fetchval("select ferry.backfill('t', chunk_size => 1)")
        await conn.fetch("select ferry.backfill_chunk($1)", backfill)
        await conn.execute("select ferry.backfill_pause($1)", backfill)
        assert await conn.fetchval("select count(*) from ferry.captures where key_columns = '{id,v}'") == 2
        await install_at(empty_db_url)
        assert await conn.fetchval("select array_agg(distinct key_columns::text) from ferry.captures") == ["{id}"]
        await conn.execute("update t set v = 5 where id = 1")
        assert await conn.fetchval("select key from ferry.events where op = 'U'") == "1"
        await conn.execute("select ferry.backfill_resume($1)", backfill)
        while (await conn.fetchrow("select * from ferry.backfill_chunk($1)", backfill))["state"] == "running":
            pass
        reads = await conn.fetch("select key, state from ferry.events e, ferry.backfills where op = 'R' order by e.id")
        assert [(r["key"], r["state"]) for r in reads] == [("[1, 1]", "done"), ("2", "done")]
    finally:
        await conn.close()


async def test_a_database_with_the_first_text_of_0035_gets_its_retries_index(db_url: str) -> None:
    """0035 made a hash index on the key alone for 50 minutes before it was edited; databases
    installed then kept it (outside probe). 0036 makes the index 0035 makes now."""
    conn = await db.connect(db_url)
    try:
        await conn.execute("drop index ferry.retries_key_idx")
        await conn.execute("create index retries_key_idx on ferry.retries using hash (key)")
        await conn.execute("delete from ferry.schema_migrations where version = 36")
        assert await install_at(db_url) == ["0036_retries_key_idx_again"]
        definition = await conn.fetchval("select indexdef from pg_indexes where indexname = 'retries_key_idx'")
        assert "btree (subscription, hashtextextended(key, (0)::bigint), event_id)" in definition, definition
    finally:
        await conn.close()


async def test_writers_of_captured_tables_go_on_while_an_upgrade_regenerates_their_captures(
    empty_db_url: str,
) -> None:
    """Regenerating the captures inside the install's transaction took the tables' locks after
    ferry.events' (the migrations), the reverse of their writers': every writer of three captured
    tables failed with "deadlock detected" during an upgrade (outside probe)."""
    conn = await db.connect(empty_db_url)
    writers = [await db.connect(empty_db_url) for _ in range(3)]
    stop = asyncio.Event()
    failures: list[str] = []

    async def write(w: asyncpg.Connection, n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                async with w.transaction():
                    for table in ("t1", "t2", "t3"):
                        await w.execute(f"insert into {table} values ($1)", n * 1_000_000 + i)
            except asyncpg.PostgresError as exc:
                failures.append(str(exc))
            await asyncio.sleep(0.001)

    try:
        await install_release(conn, releases.release("36d660b"))
        for table in ("t1", "t2", "t3"):
            await conn.execute(f"create table {table} (id int primary key)")
            await conn.execute(f"select ferry.capture_table('{table}')")
        tasks = [asyncio.create_task(write(w, n)) for n, w in enumerate(writers)]
        await asyncio.sleep(0.3)
        await install_at(empty_db_url)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
        assert failures == []
        marks = await conn.fetchval(
            "select count(*) from pg_description "
            "where description like '%(generator ' || ferry._capture_generator() || ')'"
        )
        assert marks == 9
    finally:
        stop.set()
        for w in writers:
            await w.close()
        await conn.close()
