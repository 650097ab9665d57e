"""The replication thread's hand-over to the event loop (no database: the thread is not started)."""

from __future__ import annotations

import asyncio
import time

from pgferry.capture.replication import Batch, ReplicationStream


class SlowLoop(ReplicationStream):
    """A loop busy right after the put (decoding, appending): the put's result reaches the thread late."""

    async def _put(self, item: Batch | BaseException) -> None:
        await super()._put(item)
        time.sleep(0.8)  # noqa: ASYNC251 - blocks the loop on purpose, past the thread's 0.5 s wait


async def test_a_batch_is_queued_once_however_long_the_loop_takes_to_say_so() -> None:
    """The thread gave up waiting after 0.5 s, cancelled and put again: a put that had happened
    already was made twice, and 2,000 changes were appended twice."""
    stream = SlowLoop("postgresql://unused", "slot", "publication", 0)
    batch = Batch([b"x"], 1, [1])
    handing = asyncio.ensure_future(asyncio.to_thread(stream._hand_over, batch))
    await asyncio.wait({handing}, timeout=3)
    stream._stop.set()  # lets a thread still trying give up
    assert await handing and stream._queue.qsize() == 1
