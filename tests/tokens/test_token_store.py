"""TokenStore against a real PostgreSQL: what it answers, how soon it sees new and revoked tokens,
what a flood of made-up tokens costs, and that only hashes reach the database."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from pgferry import api_tokens, db
from pgferry.api_tokens import Decision, TokenStore, TokenStoreSettings, hash_token, new_token
from pgferry.errors import PgferryError, TokenStoreUnavailable


class CountingDatabase:
    """The pool, counting the queries the store sends."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = 0
        self.sent_at: list[float] = []

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        self.queries += 1
        self.sent_at.append(time.monotonic())
        return await self.pool.fetch(query, *args)  # type: ignore[no-any-return]


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await db.create_pool(db_url, min_size=1, max_size=2)
    yield created
    await created.close()


@pytest.fixture
def counted(pool: asyncpg.Pool) -> CountingDatabase:
    return CountingDatabase(pool)


async def test_the_store_allows_matching_tokens_and_answers_401_or_403_otherwise(
    conn: asyncpg.Connection, counted: CountingDatabase
) -> None:
    reader = await api_tokens.create(conn, "reader", ["orders.*", "billing"], [])
    writer = await api_tokens.create(conn, "writer", [], ["public.?rders"])
    everything = await api_tokens.create(conn, "everything", ["*"], ["audit:*"])
    revoked = await api_tokens.create(conn, "revoked", ["*"], ["*"])
    await api_tokens.revoke(conn, "revoked")
    store = TokenStore(counted)
    assert await store.refresh() == 3

    async def answer(token: str | None, stream: str, action: api_tokens.Action) -> tuple[int, str | None]:
        decision = await store.authorize(token, stream, action)
        return decision.status, decision.token_name

    assert await answer(reader, "orders.eu:1", "read") == (200, "reader")
    assert await answer(reader, "billing", "read") == (200, "reader")
    assert await answer(reader, "billing2", "read") == (403, "reader")
    assert await answer(reader, "orders.eu", "write") == (403, "reader")
    assert await answer(writer, "public.orders", "write") == (200, "writer")
    assert await answer(writer, "public.orders", "read") == (403, "writer")
    assert await answer(everything, "anything at all", "read") == (200, "everything")
    assert await answer(everything, "audit:x", "write") == (200, "everything")
    assert await answer(everything, "orders", "write") == (403, "everything")

    refused = [
        await store.authorize(token, "orders.eu", "read")
        for token in (None, "", "garbage", f"Bearer {reader}", reader + "x", reader.upper(), new_token(), revoked)
    ]
    assert set(refused) == {api_tokens.UNAUTHORIZED}  # one answer, whatever the reason
    assert refused[0] == Decision(401, "a valid API token is required (Authorization: Bearer pft_...)")
    assert refused[0].challenge == 'Bearer realm="pgferry"'
    forbidden = await store.authorize(reader, "billing2", "read")
    assert forbidden.reason == "this API token may not read this stream" and not forbidden.allowed
    assert forbidden.challenge == 'Bearer realm="pgferry", error="insufficient_scope"'
    assert (await store.authorize(writer, "x", "write")).reason == "this API token may not publish to this stream"
    allowed = await store.authorize(everything, "x", "read")
    assert allowed.allowed and allowed.challenge is None
    with pytest.raises(ValueError, match="action must be 'read' or 'write'"):
        await store.authorize(reader, "x", "delete")  # type: ignore[arg-type]


async def test_a_new_token_works_at_once_and_a_revoked_one_is_refused_within_the_refresh_interval(
    conn: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    settings = TokenStoreSettings(refresh_interval=1.0, miss_refresh_gap=0.25)
    store = TokenStore(pool, settings)
    await store.refresh()
    token = await api_tokens.create(conn, "new", ["s"], [])
    started = time.monotonic()
    assert (await store.authorize(token, "s", "read")).allowed  # not loaded yet: a miss loads again
    assert time.monotonic() - started < settings.miss_refresh_gap + 0.5

    await api_tokens.revoke(conn, "new")
    revoked_at = time.monotonic()
    while (await store.authorize(token, "s", "read")).allowed:
        assert time.monotonic() - revoked_at < settings.refresh_interval + 0.5, "a revoked token still allowed"
        await asyncio.sleep(0.05)
    assert (await store.authorize(token, "s", "read")).status == 401


async def test_a_flood_of_unknown_tokens_costs_at_most_one_query_a_second(
    conn: asyncpg.Connection, counted: CountingDatabase
) -> None:
    good = await api_tokens.create(conn, "good", ["*"], [])
    store = TokenStore(counted)  # the defaults: reload every 5 s, on a miss at most once a second
    await store.refresh()
    assert counted.queries == 1
    # Malformed tokens never reach the database, however many.
    for i in range(10_000):
        assert (await store.authorize(f"pft_{i}", "s", "read")).status == 401
    assert counted.queries == 1

    waits: list[float] = []

    async def flood(until: float) -> None:
        while time.monotonic() < until:
            started = time.monotonic()
            assert (await store.authorize(new_token(), "s", "read")).status == 401
            waits.append(time.monotonic() - started)

    seconds = 3.0
    until = time.monotonic() + seconds
    await asyncio.gather(*(flood(until) for _ in range(50)))
    assert counted.queries - 1 <= seconds + 1, f"{counted.queries - 1} queries for {len(waits)} unknown tokens"
    assert min(b - a for a, b in itertools.pairwise(counted.sent_at)) >= 0.99
    assert len(waits) >= 100  # a flood, each request held until the next load (at most a second and the query)
    assert max(waits) < 1.5
    assert (await store.authorize(good, "s", "read")).allowed


async def test_the_store_notes_a_token_s_use_on_its_next_load_at_most_once_a_minute(
    conn: asyncpg.Connection, counted: CountingDatabase
) -> None:
    token = await api_tokens.create(conn, "used", ["s"], [])
    store = TokenStore(counted)
    await store.refresh()
    assert (await store.authorize(token, "s", "read")).allowed
    assert await conn.fetchval("select last_used_at from ferry.api_tokens") is None  # no write per request
    await store.refresh()
    first = await conn.fetchval("select last_used_at from ferry.api_tokens")
    assert first is not None
    assert (await store.authorize(token, "s", "read")).allowed
    await store.refresh()
    assert await conn.fetchval("select last_used_at from ferry.api_tokens") == first
    await conn.execute("update ferry.api_tokens set last_used_at = last_used_at - interval '61 seconds'")
    await store.refresh()  # a minute later, the next use is noted again
    assert (await store.authorize(token, "s", "read")).allowed
    await store.refresh()
    assert await conn.fetchval("select last_used_at from ferry.api_tokens") > first
    assert counted.queries == 5  # one per load, noting included


class _Unreachable:
    def __init__(self) -> None:
        self.queries = 0

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        self.queries += 1
        raise ConnectionRefusedError(111, "Connection refused")


async def test_a_store_that_cannot_load_its_tokens_says_so_and_keeps_trying_at_most_once_a_second() -> None:
    database = _Unreachable()
    store = TokenStore(database, TokenStoreSettings(refresh_interval=1.0, miss_refresh_gap=0.2))
    with pytest.raises(TokenStoreUnavailable, match=r"cannot load the API tokens: .*Connection refused"):
        await store.refresh()
    # a malformed token needs no tokens: refused without trying
    assert (await store.authorize("nope", "s", "read")).status == 401
    started = time.monotonic()
    results = await asyncio.gather(
        *(store.authorize(new_token(), "s", "read") for _ in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, TokenStoreUnavailable) for r in results)
    assert database.queries == 2  # the twenty requests shared one attempt...
    assert time.monotonic() - started >= 0.15  # ...made no sooner than the gap after the last


def test_the_store_settings_are_checked() -> None:
    with pytest.raises(PgferryError, match="0 < miss_refresh_gap <= refresh_interval"):
        TokenStoreSettings(refresh_interval=1, miss_refresh_gap=2)
    with pytest.raises(PgferryError, match="0 < miss_refresh_gap"):
        TokenStoreSettings(miss_refresh_gap=0)


async def test_only_the_hash_reaches_the_database(conn: asyncpg.Connection, pool: asyncpg.Pool) -> None:
    token = await api_tokens.create(conn, "secret-keeper", ["*"], ["*"])
    store = TokenStore(pool)
    assert (await store.authorize(token, "s", "write")).allowed
    await store.refresh()  # and note its use
    secret = token.removeprefix("pft_")
    assert await conn.fetchval("select token_hash from ferry.api_tokens") == hash_token(token)
    tables = await conn.fetch(
        "select format('%I.%I', schemaname, tablename) as t from pg_tables where schemaname = 'ferry'"
    )
    assert "ferry.api_tokens" in {r["t"] for r in tables}
    for row in tables:
        found = await conn.fetchval(f"select count(*) from {row['t']} x where x::text like '%' || $1 || '%'", secret)
        assert found == 0, f"the token is in {row['t']}"
    # what list shows: names, patterns, dates; neither the token nor its hash
    listed = await api_tokens.list_tokens(conn)
    assert set(listed[0]) == {"name", "read_patterns", "write_patterns", "created_at", "created_by",
                              "last_used_at", "revoked_at"}  # fmt: skip
