"""A relay on a backlog of large events stays within its memory ceiling and delivers each event once.

The relay runs as `pgferry run` in a subprocess; its peak resident memory
(VmHWM from /proc) is read once every event has arrived. Without the byte
bound the whole backlog (here 43 MB of payloads, in transactions larger
than the bound, so their ranges are read in parts) would be read at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import asyncpg

from pgferry.bench.procstat import memory_mb
from pgferry.bench.relay import running_relay
from pgferry.receiver import Action, Received, Receiver, Respond

EVENTS = 48
EVENT_BYTES = 900 << 10  # under the 1 MB request body limit (ferry.config.max_body_bytes)
#: What the relay may add to its memory at start while delivering the backlog with a 4 MB bound:
#: a tenth of what reading the backlog at once takes (43 MB of payloads, held two or three times).
HEADROOM_MB = 40


async def test_a_relay_delivers_a_backlog_of_large_events_once_within_its_memory_ceiling(
    conn: asyncpg.Connection, db_url: str
) -> None:
    seen: Counter[str] = Counter()

    def count(request: Received) -> Action:
        seen[request.headers["webhook-id"]] += 1
        return Respond()

    receiver = Receiver(count, keep=False)
    url = await receiver.start()
    try:
        await conn.execute("create table docs (id bigserial primary key, doc jsonb not null)")
        await conn.execute("select ferry.capture_table('docs', 'docs')")
        await conn.execute("select ferry.subscribe('hook', array['docs'], $1)", url)
        for _ in range(EVENTS // 8):  # 7 MB a transaction: over the bound, so read in parts
            await conn.execute(
                """insert into docs (doc) select jsonb_build_object('body', repeat(md5(g::text || random()::text), $1))
                   from generate_series(1, 8) g""",
                EVENT_BYTES // 32,
            )
            await conn.execute("select ferry.tick(true)")
        ids = {r["id"] for r in await conn.fetch("select id from ferry.events")}
        async with running_relay(db_url, max_seconds=120, args=["--max-batch-bytes", "4MB"]) as proc:
            start_mb = memory_mb(proc.pid)["VmRSS"]
            deadline = time.monotonic() + 90
            while len(seen) < EVENTS:
                assert proc.returncode is None and time.monotonic() < deadline, f"{len(seen)} of {EVENTS} arrived"
                await asyncio.sleep(0.05)
            peak_mb = memory_mb(proc.pid)["VmHWM"]
    finally:
        await receiver.stop()
    assert set(seen) == {f"evt_{i}" for i in ids}
    assert all(n == 1 for n in seen.values()), "each event delivered exactly once"
    assert peak_mb - start_mb < HEADROOM_MB, f"peak {peak_mb:.0f} MB, {start_mb:.0f} MB at start"
