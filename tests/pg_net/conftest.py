"""pg_net-compatible API fixtures: the add-on installed, a relay, receivers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from pgferry import db
from pgferry.schema import install
from tests.helpers import RunningRelay


@pytest.fixture
async def net_db(db_url: str) -> str:
    conn = await db.connect(db_url)
    try:
        await install(conn, addons=["pg_net"])
        # Tests want quick, few retries; pg_net's own single attempt is one setting away.
        await conn.execute(
            "update ferry.subscriptions set retry_base_ms = 20, retry_max_ms = 200 where name = 'pg_net'"
        )
    finally:
        await conn.close()
    return db_url


@pytest.fixture
async def net_conn(net_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(net_db)  # a plain connection, as a pg_net user would have
    yield conn
    await conn.close()


@pytest.fixture
async def net_relay(net_db: str) -> AsyncIterator[RunningRelay]:
    running = RunningRelay(net_db)
    yield running
    await running.stop()
