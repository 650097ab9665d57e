"""pgferry's own database sessions: the settings every one starts with."""

import pgferry
from pgferry import db


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
