"""Rows of the relay's hot read become events (delivery.model.OutEvent.from_batch_row)."""

import asyncpg

from pgferry import db
from pgferry.delivery.model import OutEvent
from tests.helpers import tick, webhook_steps


async def test_created_at_as_text_is_the_timestamp_postgresql_holds(db_url: str) -> None:
    """The read returns created_at as UTC text, parsed by the relay: every shape PostgreSQL prints
    (no fraction, trailing zeros trimmed, years 1 to 9999) comes back as the instant asyncpg decodes,
    in a session whose TimeZone is not UTC."""
    conn = await db.connect(db_url, server_settings={**db.DELIVERY_SETTINGS, "TimeZone": "America/St_Johns"})
    try:
        rows = await conn.fetch(
            """select t, (t at time zone 'UTC')::text as created_at
               from unnest(array['0001-01-01 00:00:00+00', '1999-12-31 23:59:59.999999+00',
                                 '2026-03-29 01:30:00.5+00', '2026-12-05 15:40:37.2831+00',
                                 '9999-12-31 23:59:59.000001+00']::timestamptz[]) as u(t)
               union all
               select t, (t at time zone 'UTC')::text
               from (select timestamptz '2000-01-01 00:00:00+00' + g * interval '37 days 1234567 microseconds' as t
                     from generate_series(-9000, 9000, 7) g) x"""
        )
        for row in rows:
            event = OutEvent.from_batch_row({"id": 1, "stream": "s", "key": None, "payload": "{}", "headers": None,
                                             "created_at": row["created_at"]})  # fmt: skip
            assert event.created_at == row["t"], row
    finally:
        await conn.close()


async def test_a_reads_events_carry_their_commit_transactions_time(db_url: str, conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    async with conn.transaction():
        await conn.execute("select ferry.publish('s', '1')")
        await conn.execute("select pg_sleep(0.01)")
        await conn.execute("select ferry.publish('s', '2')")
    await conn.execute("select ferry.publish('s', '3')")
    await tick(conn)
    relay = await db.connect(db_url, server_settings=db.DELIVERY_SETTINGS)
    try:
        rows = await webhook_steps(relay, ["c"], ["c"], max_bytes=1 << 20)
    finally:
        await relay.close()
    events = [OutEvent.from_batch_row(r) for r in rows if r["id"] is not None]
    stored = await conn.fetch("select id, created_at from ferry.events order by id")
    assert [(e.id, e.created_at) for e in events] == [(r["id"], r["created_at"]) for r in stored]
    assert events[0].created_at == events[1].created_at != events[2].created_at  # one transaction, one time
