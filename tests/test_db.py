"""pgferry's own database sessions: the settings every one starts with, and URLs refused before one."""

import asyncpg
import pytest

import pgferry
from pgferry import db
from pgferry.errors import DatabaseUnreachable


async def test_every_pgferry_session_runs_without_jit(db_url: str) -> None:
    # Compiling pgferry's short statements (misestimated on small, never analyzed tables)
    # cost 1.2 s of CPU per housekeeping call; no pgferry session may take that path.
    conn = await db.connect(db_url, server_settings={"application_name": "probe"})
    try:
        assert await conn.fetchval("show jit") == "off"
        assert await conn.fetchval("show application_name") == "probe"  # the caller's settings still apply
    finally:
        await conn.close()
    pool = await db.create_pool(db_url, server_settings={"application_name": "probe pool"})
    try:
        assert await pool.fetchval("show jit") == "off"
    finally:
        await pool.close()
    async with pgferry.connect(db_url) as ferry, ferry.pool.acquire() as pooled:
        assert await pooled.fetchval("show jit") == "off"


async def test_a_caller_may_turn_jit_back_on(db_url: str) -> None:
    conn = await db.connect(db_url, server_settings={"jit": "on"})
    try:
        assert await conn.fetchval("show jit") == "on"
    finally:
        await conn.close()


async def test_a_lock_holding_session_is_ended_mid_statement_once_its_relay_is_gone(db_url: str) -> None:
    """A SIGKILLed leader's backend finished its statement (an append on a busy machine) before it
    let go of the leader lock: a standby took over WAL capture ~10 s after the kill (a CI run)."""
    conn = await db.connect(db_url, **db.Liveness().connect_kwargs("pgferry test", holds_locks=True))
    try:
        assert await conn.fetchval("show client_connection_check_interval") == "1s"
    finally:
        await conn.close()


async def test_a_malformed_database_url_is_refused_in_one_line_saying_what_is_wrong(db_url: str) -> None:
    """asyncpg answered these with an OverflowError, a ValueError or PostgreSQL's bare refusal of a
    setting no one had asked for (the URL's query parameter): each is one line naming the fault."""
    host = db_url.split("@", 1)[1].split("/", 1)[0]  # 127.0.0.1:PORT
    cases = [
        ("postgresql://postgres@127.0.0.1:99999/app", "has port '99999': a port is a number from 1 to 65535"),
        ("postgresql://postgres@127.0.0.1:abc/app", "has port 'abc'"),
        ("postgresql://postgres@127.0.0.1:²/app", "has port '²'"),
        ("postgresql://me:secret@[::1/app", "'postgresql://me:***@[::1/app' is malformed (Invalid IPv6 URL)"),
        (f"{db_url}?connect_timeout=abc", "?connect_timeout= in the URL is not a connection parameter"),
        (f"postgresql://postgres@{host},{host}/app", "the database does not exist"),  # a host list still parses
        # A password holding / or ? unencoded: urlsplit's host part ended there, no password was found
        # to hide, and the URL was printed whole, blaming its "port" (a reviewer's base64 password).
        ("postgresql://me:secret/k+Q2@127.0.0.1:5432/app", "percent-encode it (/ as %2F"),
        ("postgresql://me:se?cret@127.0.0.1:5432/app", "'postgresql://me:***@127.0.0.1:5432/app': its password"),
    ]
    for url, says in cases:
        for opening in (db.connect(url), db.create_pool(url)):
            with pytest.raises(DatabaseUnreachable) as refused:
                await opening
            assert says in str(refused.value) and "\n" not in str(refused.value), (url, str(refused.value))
            assert "secret" not in str(refused.value)
    with pytest.raises(DatabaseUnreachable) as tried:  # an empty port is the default (5432), as libpq takes it
        await db.connect("postgresql://postgres@127.0.0.1:/pgferry_no_such_database")
    assert "has port" not in str(tried.value)


def test_a_pooler_refusing_pgferry_s_startup_settings_is_named_with_what_to_do() -> None:
    """Through PgBouncer every pgferry session was refused with its bare "unsupported startup parameter:
    jit" and "Check --database-url" (outside probe; a unit test: no PgBouncer in CI)."""
    refused = asyncpg.ProtocolViolationError("unsupported startup parameter: jit")
    text = str(db._explain("postgresql://app:secret@127.0.0.1:6432/app", refused))
    assert "unsupported startup parameter: jit: a connection pooler (PgBouncer?) is in the way" in text, text
    assert "need a direct connection to PostgreSQL" in text and "call ferry.publish in SQL" in text
    assert "secret" not in text
