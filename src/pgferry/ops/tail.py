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
from pgferry.ops.inspect import unwritten_warning
from pgferry.schema import check_installed

log = logging.getLogger(__name__)


#: a running relay ticks at least every ferry.config.idle_tick_interval (10 s)
QUIET_WARNING_S = 30.0


async def tail(
    url: str,
    streams: Sequence[str] | None,
    *,
    poll_interval: float = 1.0,
) -> AsyncIterator[Event]:
    """Yield events of ``streams`` (all streams if None) as they commit, forever.

    Warns of each of ``streams`` nothing has written yet (a misspelling?), as `subscription add` does.
    Says once (as a warning) when no tick came for a while: events only show
    once a relay's ticker records them, so a tail without a relay is silent.
    Raises SchemaMissing (saying how to install) on a database without the schema.
    """
    conn = await db.connect(url, server_settings={"application_name": "pgferry tail"})
    try:
        await check_installed(conn)
        for stream in await conn.fetchval(sql.query("unknown_streams"), list(streams or ())):
            # a misspelt stream otherwise looked like a quiet one, forever (outside review)
            log.warning("%s", unwritten_warning(stream, "tail prints its events once they arrive"))
        wake = asyncio.Event()
        await conn.add_listener(TICK_CHANNEL, lambda *_: wake.set())
        position = await conn.fetchval(sql.query("latest_tick"))
        stream_list = list(streams) if streams else None
        loop = asyncio.get_running_loop()
        moved_at = loop.time()
        warned = False
        while True:
            wake.clear()
            newest = await conn.fetchval(sql.query("latest_tick"))
            if newest is not None and position is not None and newest > position:
                if not await conn.fetchval(sql.query("tick_exists"), position):
                    log.warning("tail fell behind retention; skipping to the newest events")
                    position = newest
                    continue
                rows = await conn.fetch(sql.query("batch_events"), position, newest, stream_list, None)
                for row in rows:
                    yield Event.from_row(row)
                position = newest
                moved_at = loop.time()
            elif position is None:
                position = newest
            elif not warned and loop.time() - moved_at > QUIET_WARNING_S:
                log.warning("no tick for %.0f s: is a relay (pgferry run) running? events show once it ticks",
                            QUIET_WARNING_S)  # fmt: skip
                warned = True
            await wait_for_event(wake, poll_interval)
    finally:
        await conn.close()
