"""The delivery pool plans each statement for its call (db.DELIVERY_SETTINGS): a retry read
prepared while ferry.retries was empty kept a sequential scan after an outage filled it."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import pytest

from pgferry import db, sql
from tests.helpers import explained


async def _retry_read_plan(url: str, conn: asyncpg.Connection, settings: Mapping[str, str]) -> str:
    """The plan of subscription w's retry read once 20,000 events of 100 subscriptions are
    parked, in a session that read w's retries 8 times while there were none."""
    for i in range(100):
        await conn.execute(f"select ferry.subscribe('w{i}', array['s'], 'http://127.0.0.1:9/')")
    await conn.execute("vacuum analyze ferry.retries")
    async with explained(url, **settings) as (session, plans):
        args = ("w0", False, 100, None, 0, 1)
        for _ in range(8):  # prepared once (asyncpg), planned while the table is empty
            await session.fetch(sql.query("due_retries"), *args)
        await conn.execute(
            "insert into ferry.retries (subscription, event_id, stream, payload, event_created_at, attempts,"
            " first_failed_at, next_attempt_at)"
            " select 'w' || (g % 100), g, 's', '{}', now(), 1, now(), now() + interval '1 hour'"
            " from generate_series(1, 20000) g"
        )
        plans.clear()
        await session.fetch(sql.query("due_retries"), *args)
    return "\n".join(plans)


# "default": PostgreSQL's own plan_cache_mode (explained forces generic plans otherwise)
@pytest.mark.parametrize("settings", [{"plan_cache_mode": "auto"}, db.DELIVERY_SETTINGS], ids=["default", "delivery"])
async def test_a_retry_read_uses_the_index_once_an_outage_fills_the_retries(
    db_url: str, conn: asyncpg.Connection, settings: Mapping[str, str]
) -> None:
    plan = await _retry_read_plan(db_url, conn, settings)
    assert "on retries" in plan, plan
    if settings is db.DELIVERY_SETTINGS:
        assert "Seq Scan on retries" not in plan, plan
    else:  # the trap, without the delivery pool's settings
        assert "Seq Scan on retries" in plan, plan
