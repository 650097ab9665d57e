"""Publishing from SQL and from Python, and the errors for bad input."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

import pgferry
from tests.helpers import read_all


async def test_publish_from_sql_and_python(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("c")
    sql_id = await conn.fetchval(
        """select ferry.publish('orders', '{"id": 1}', key => '1', headers => '{"x-a": "b"}')"""
    )
    py_id = await ferry.publish("orders", {"id": 2, "tags": ["a", "ü"]}, key="2", headers={"x-a": "c"})
    many = await ferry.publish_many(
        [{"stream": "orders", "payload": {"id": i}, "key": str(i)} for i in range(3, 6)]
        + [{"stream": "audit", "payload": [1, 2], "headers": {"h": "v"}}]
    )
    assert sql_id < py_id < many[0] and many == sorted(many) and len(many) == 4
    events = await read_all(ferry, conn, "c")
    assert [e.id for e in events] == [sql_id, py_id, *many]
    assert events[1].payload == {"id": 2, "tags": ["a", "ü"]} and events[1].headers == {"x-a": "c"}
    assert [e.key for e in events] == ["1", "2", "3", "4", "5", None]
    assert events[-1].stream == "audit" and events[-1].headers == {"h": "v"}


async def test_publish_joins_the_callers_transaction(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    await ferry.register_consumer("c")
    async with conn.transaction():
        kept = await ferry.publish("s", {"n": 1}, conn=conn)
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await ferry.publish("s", {"n": 2}, conn=conn)
            await ferry.publish_many([{"stream": "s", "payload": {"n": 3}}], conn=conn)
            raise RuntimeError("roll back")
    events = await read_all(ferry, conn, "c")
    assert [e.id for e in events] == [kept]


async def test_conn_must_be_the_asyncpg_connection_whose_transaction_the_event_joins(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """A pool as conn= published outside the caller's transaction (delivered although it rolled
    back); a psycopg connection failed with AttributeError: ... no attribute 'fetchval' (outside probe)."""

    class AsyncConnection:  # what psycopg's and SQLAlchemy's look like to pgferry: not asyncpg's
        pass

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1)
    try:
        calls: dict[str, Callable[[Any], Awaitable[object]]] = {
            "publish": lambda c: ferry.publish("s", 1, conn=c),
            "publish_many": lambda c: ferry.publish_many([{"stream": "s", "payload": 1}], conn=c),
            "close_stream": lambda c: ferry.close_stream("s", conn=c),
        }
        for name, call in calls.items():
            with pytest.raises(
                TypeError, match=r"conn must be the asyncpg connection whose transaction .*\(a pool publishes"
            ):
                await call(pool)
            with pytest.raises(TypeError, match=r"not .*AsyncConnection: .*select ferry\.publish"):
                await call(AsyncConnection())
            with pytest.raises(RuntimeError):  # a connection of the pool is one: the event joins its transaction
                async with pool.acquire() as pooled, pooled.transaction():
                    await call(pooled)
                    raise RuntimeError(f"roll back {name}")
    finally:
        await pool.close()
    assert await conn.fetchval("select count(*) from ferry.events where stream = 's'") == 0


@pytest.mark.parametrize("stream", [None, "", "   "])
async def test_publish_rejects_missing_stream_in_sql(conn: asyncpg.Connection, stream: str | None) -> None:
    with pytest.raises(asyncpg.PostgresError, match="stream must be a non-empty name"):
        await conn.execute("select ferry.publish($1, '{}')", stream)


@pytest.mark.parametrize("stream", ["ctl\nname", "tab\there", "c1\u0085"])
async def test_stream_names_with_control_characters_are_refused_as_the_api_refuses_them(
    conn: asyncpg.Connection, stream: str
) -> None:
    """Accepted from SQL, such a stream could be read only from Python: the API answers 400 to its name."""
    with pytest.raises(asyncpg.PostgresError, match="holds control characters"):
        await conn.execute("select ferry.publish($1, '{}')", stream)
    with pytest.raises(asyncpg.PostgresError, match="without control characters"):
        await conn.execute("select ferry.publish_many(array['ok', $1], array['1', '2']::jsonb[])", stream)


async def test_publish_rejects_bad_input(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    with pytest.raises(pgferry.InvalidEvent, match="stream must be a non-empty name"):
        await ferry.publish("", {})
    with pytest.raises(pgferry.InvalidEvent, match="payload is not JSON-serializable"):
        await ferry.publish("s", {"when": object()})
    with pytest.raises(pgferry.InvalidEvent, match="payload of event #1 is not JSON-serializable"):
        await ferry.publish_many([{"stream": "s", "payload": 1}, {"stream": "s", "payload": {1, 2}}])
    for payload in (float("nan"), {"x": [1, {"y": float("inf")}]}, (None, -float("inf")), _Reading(float("nan"))):
        with pytest.raises(pgferry.InvalidEvent, match="payload holds NaN or Infinity"):
            await ferry.publish("s", payload)
    with pytest.raises(pgferry.InvalidEvent, match="payload of event #0 holds NaN"):
        await ferry.publish_many([{"stream": "s", "payload": {"v": float("nan")}}])
    with pytest.raises(pgferry.InvalidEvent, match="must be a mapping with 'stream' and 'payload'"):
        await ferry.publish_many([{"payload": 1}])
    with pytest.raises(pgferry.InvalidEvent, match="headers must be a mapping"):
        await ferry.publish("s", {}, headers=["x"])  # type: ignore[arg-type]
    with pytest.raises(asyncpg.PostgresError, match="headers must be a JSON object"):
        await conn.execute("""select ferry.publish('s', '{}', headers => '[1]')""")
    with pytest.raises(asyncpg.PostgresError, match="payload must not be NULL"):
        await conn.execute("select ferry.publish('s', null)")
    with pytest.raises(asyncpg.PostgresError, match="same length"):
        await conn.execute("select ferry.publish_many(array['a','b'], array['{}'::jsonb])")
    with pytest.raises(asyncpg.PostgresError, match="invalid input syntax for type json"):
        await conn.execute("select ferry.publish('s', 'not json')")
    assert await conn.fetchval("select count(*) from ferry.events") == 0


async def test_wrong_database_url_gets_a_clear_error(empty_db_url: str) -> None:
    with pytest.raises(pgferry.DatabaseUnreachable, match="not a PostgreSQL URL"):
        await pgferry.connect("mysql://localhost/x").open()
    with pytest.raises(pgferry.DatabaseUnreachable, match=r"cannot connect to PostgreSQL at .*127\.0\.0\.1:1/"):
        await pgferry.connect("postgresql://u:secret@127.0.0.1:1/db").open()
    with pytest.raises(pgferry.DatabaseUnreachable, match="database does not exist") as err:
        await pgferry.connect(empty_db_url.rsplit("/", 1)[0] + "/no_such_db").open()
    assert "secret" not in str(err.value)
    with pytest.raises(pgferry.SchemaMissing, match="pgferry install"):
        await pgferry.connect(empty_db_url).open()


async def test_password_is_redacted_in_errors() -> None:
    with pytest.raises(pgferry.DatabaseUnreachable) as err:
        await pgferry.connect("postgresql://u:hunter2@127.0.0.1:1/db").open()
    assert "hunter2" not in str(err.value) and "***" in str(err.value)


async def test_connections_ferry_used_itself_skip_the_reset_and_yours_get_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ferry's own statements leave no session state, so giving their connection back costs no
    reset round trip; a connection your code took from ``ferry.pool`` is reset as asyncpg does."""
    resets = 0
    original = asyncpg.Connection.reset

    async def counting(self: asyncpg.Connection, *, timeout: float | None = None) -> None:
        nonlocal resets
        resets += 1
        await original(self, timeout=timeout)

    monkeypatch.setattr(asyncpg.Connection, "reset", counting)
    async with pgferry.connect(db_url, pool_size=1) as ferry:
        after_open = resets
        for n in range(5):
            await ferry.publish("reset:check", {"n": n})
        await ferry.publish_many([{"stream": "reset:check", "payload": 5}])
        assert resets == after_open  # none for Ferry's own calls
        async with ferry.pool.acquire() as conn:
            await conn.execute("set statement_timeout = '123s'")
        assert resets == after_open + 1
        await ferry.publish("reset:check", {"n": 6})  # same connection (pool of one): state gone
        async with ferry.pool.acquire() as conn:
            assert await conn.fetchval("show statement_timeout") == "0"
        with pytest.raises(pgferry.PgferryError):
            await ferry.close_stream("reset:check")
            await ferry.publish("reset:check", {"n": 7})  # fails: closed; the connection is reset
        assert resets == after_open + 3


@dataclass
class _Reading:  # orjson serializes dataclasses: a NaN field was written as null too
    value: float
