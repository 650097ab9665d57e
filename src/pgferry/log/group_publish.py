"""Group commit for ``Ferry.publish()`` calls that bring no connection of their own.

Each such call is its own transaction, and on a busy writer the per-transaction
cost (a round trip, a commit, a WAL flush) is most of the work: 16 tasks calling
``publish()`` made ~4.3K events/s while 1,000 SSE readers followed the streams.
Calls that arrive while earlier ones are in flight are therefore gathered and
written by one ``ferry.publish_many`` statement, in one transaction, and every
caller gets its own event id back once that transaction has committed. A lone
call waits for nothing: a batch starts at once whenever fewer than
``max_in_flight`` are running, so batching only happens under load.

A batch that fails for a reason one event can cause (``retry_alone``: a closed
stream, a bad stream name, PostgreSQL's class 22 and 55000) is written again one event per transaction, so that each
caller gets its own exact answer and no event pays for another's error. Other
failures (a lost connection) reach every caller of the batch, as they would
have reached each single call. A caller cancelled before its batch starts is
left out of it; one cancelled later may still have its event committed (as a
cancelled single publish may have committed before the cancel arrived).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

#: (stream, payload JSON text, key, headers JSON text or None): ``ferry.publish``'s arguments
PublishArgs = tuple[Any, str, str | None, str | None]

#: Most events one statement carries: big enough that per-statement costs vanish,
#: small enough that a batch's transaction stays short.
MAX_BATCH = 500


class GroupPublisher:
    """Gathers concurrent publishes into ``publish_many`` batches; see the module docstring."""

    def __init__(
        self,
        publish_one: Callable[[PublishArgs], Awaitable[int]],
        publish_many: Callable[[Sequence[PublishArgs]], Awaitable[list[int]]],
        *,
        max_in_flight: int,
        retry_alone: tuple[type[BaseException], ...],
        max_batch: int = MAX_BATCH,
    ) -> None:
        if max_in_flight < 1 or max_batch < 1:
            raise ValueError("max_in_flight and max_batch must be at least 1")
        self._publish_one = publish_one
        self._publish_many = publish_many
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._retry_alone = retry_alone
        self._pending: deque[tuple[PublishArgs, asyncio.Future[int]]] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def publish(self, args: PublishArgs) -> int:
        """Write one event, alone or with others that arrive meanwhile; return its id."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((args, future))
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self) -> None:
        """Write batches while calls are waiting; one of at most ``max_in_flight`` such loops."""
        try:
            while self._pending:
                batch = self._take()
                if batch:
                    await self._write(batch)
        finally:
            self._in_flight -= 1

    def _take(self) -> list[tuple[PublishArgs, asyncio.Future[int]]]:
        batch: list[tuple[PublishArgs, asyncio.Future[int]]] = []
        while self._pending and len(batch) < self._max_batch:
            args, future = self._pending.popleft()
            if not future.done():  # a caller cancelled while waiting is left out
                batch.append((args, future))
        return batch

    async def _write(self, batch: list[tuple[PublishArgs, asyncio.Future[int]]]) -> None:
        if len(batch) == 1:
            await self._settle(batch[0][1], self._publish_one(batch[0][0]))
            return
        try:
            ids = await self._publish_many([args for args, _ in batch])
        except self._retry_alone:  # one event's fault: each is written alone and gets its own answer
            for args, future in batch:
                if not future.done():
                    await self._settle(future, self._publish_one(args))
            return
        except BaseException as exc:
            for _, future in batch:
                _fail(future, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), event_id in zip(batch, ids, strict=True):
            if not future.done():
                future.set_result(event_id)

    @staticmethod
    async def _settle(future: asyncio.Future[int], call: Awaitable[int]) -> None:
        try:
            result = await call
        except BaseException as exc:  # the caller's own error, handed to the caller
            _fail(future, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not future.done():
                future.set_result(result)

    async def aclose(self) -> None:
        """Wait for batches in flight (on ``Ferry.close()``), so none is cut off mid-commit."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _fail(future: asyncio.Future[int], exc: BaseException) -> None:
    """Hand ``exc`` to a caller still waiting; a cancelled batch cancels its callers."""
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
