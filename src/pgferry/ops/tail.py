"""Follow a stream live, without a consumer.

``pgferry tail`` must not disturb anything: it registers no consumer (so it
never pins retention, during or after), takes no consumer lock and acks
nothing. It starts at the newest tick and reads each new tick range with
``ferry.batch_events``, exactly as a consumer's batch would be read: events
appear in commit order, once each, as the relay's ticker records them. It
wakes on the tick notification and polls every second in case one is lost.

Because it holds nothing, retention may remove the tick it is positioned at
if it falls far behind (minutes); it then says so and jumps to the newest
tick instead of holding the log back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from pgferry import db, sql
from pgferry.aio import wait_for_event
from pgferry.log.events import Event
from pgferry.log.reader import TICK_CHANNEL

log = logging.getLogger(__name__)


async def tail(
    url: str,
    streams: Sequence[str] | None,
    *,
    poll_interval: float = 1.0,
) -> AsyncIterator[Event]:
    """Yield events of ``streams`` (all streams if None) as they commit, forever."""
    conn = await db.connect(url, server_settings={"application_name": "pgferry tail"})
    try:
        wake = asyncio.Event()
        await conn.add_listener(TICK_CHANNEL, lambda *_: wake.set())
        position = await conn.fetchval(sql.query("latest_tick"))
        stream_list = list(streams) if streams else None
        while True:
            wake.clear()
            newest = await conn.fetchval(sql.query("latest_tick"))
            if newest is not None and position is not None and newest > position:
                if not await conn.fetchval(sql.query("tick_exists"), position):
                    log.warning("tail fell behind retention; skipping to the newest events")
                    position = newest
                    continue
                rows = await conn.fetch(sql.query("batch_events"), position, newest, stream_list)
                for row in rows:
                    yield Event.from_row(row)
                position = newest
            elif position is None:
                position = newest
            await wait_for_event(wake, poll_interval)
    finally:
        await conn.close()
