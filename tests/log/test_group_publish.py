"""Overlapping publish() calls share a transaction, and each caller still gets its own answer."""

import asyncio
from collections.abc import Sequence

import asyncpg
import pytest

import pgferry
from pgferry.errors import EventRefused, InvalidEvent
from pgferry.log.group_publish import GroupPublisher, PublishArgs

CALLS = 300


async def _stored(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await conn.fetch("select id, txid, stream, key, payload::text from ferry.events order by id"))


@pytest.mark.parametrize("grouped", [True, False])
async def test_every_overlapping_call_gets_its_own_committed_event(
    db_url: str, conn: asyncpg.Connection, grouped: bool
) -> None:
    async with pgferry.Ferry(db_url, pool_size=8, group_publishes=grouped) as ferry:
        ids = await asyncio.gather(*(ferry.publish(f"s{i % 7}", {"n": i}, key=str(i)) for i in range(CALLS)))
    rows = {row["id"]: row for row in await _stored(conn)}
    assert len(set(ids)) == CALLS and set(ids) == set(rows)
    for i, event_id in enumerate(ids):  # each caller's id is its own event, not a neighbour's
        row = rows[event_id]
        assert (row["stream"], row["key"], row["payload"]) == (f"s{i % 7}", str(i), f'{{"n": {i}}}')
    transactions = len({row["txid"] for row in rows.values()})
    if grouped:
        assert transactions < CALLS / 5, f"{transactions} transactions for {CALLS} overlapping calls"
    else:
        assert transactions == CALLS


async def test_a_refused_event_fails_its_own_caller_and_no_other(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await ferry.close_stream("closed")
    streams = ["open", "closed", "bad\x01name"] * 40
    results = await asyncio.gather(
        *(ferry.publish(stream, {"n": i}) for i, stream in enumerate(streams)), return_exceptions=True
    )
    for stream, result in zip(streams, results, strict=True):
        if stream == "open":
            assert isinstance(result, int)
        elif stream == "closed":
            assert isinstance(result, EventRefused) and "stream 'closed' is closed" in str(result)
        else:
            assert isinstance(result, InvalidEvent) and "control characters" in str(result)
    stored = [row for row in await _stored(conn) if row["stream"] == "open"]
    assert sorted(row["id"] for row in stored) == sorted(r for r in results if isinstance(r, int))


async def test_publish_many_is_refused_as_a_whole(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    """publish_many() keeps its one-transaction meaning: one bad event refuses them all."""
    await ferry.close_stream("closed")
    with pytest.raises(EventRefused):
        await ferry.publish_many([{"stream": "open", "payload": 1}, {"stream": "closed", "payload": 2}])
    assert [row for row in await _stored(conn) if row["stream"] == "open"] == []


# -- the unit alone, with stand-ins for the database ---------------------------------------------


def _args(n: int) -> PublishArgs:
    return ("s", str(n), None, None)


async def _turns() -> None:
    """Let the tasks just started run up to their first wait (caller, then its batch)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_lone_call_starts_at_once_and_later_ones_wait_for_a_free_slot() -> None:
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def one(args: PublishArgs) -> int:
        batches.append([args[1]])
        await release.wait()
        return int(args[1])

    async def many(batch: Sequence[PublishArgs]) -> list[int]:
        batches.append([args[1] for args in batch])
        return [int(args[1]) for args in batch]

    group = GroupPublisher(one, many, max_in_flight=1, retry_alone=(ValueError,))
    first = asyncio.create_task(group.publish(_args(0)))
    await _turns()
    assert batches == [["0"]]  # no waiting for company
    waiting = [asyncio.create_task(group.publish(_args(n))) for n in (1, 2, 3)]
    await _turns()
    waiting[1].cancel()  # cancelled before its batch starts: left out of it
    await _turns()
    release.set()
    assert await first == 0 and await waiting[0] == 1 and await waiting[2] == 3
    assert batches == [["0"], ["1", "3"]]
    await group.aclose()


async def test_a_failure_no_event_caused_reaches_every_caller_of_the_batch() -> None:
    gate = asyncio.Event()

    async def one(args: PublishArgs) -> int:
        await gate.wait()
        return 0

    async def many(batch: Sequence[PublishArgs]) -> list[int]:
        raise ConnectionResetError("connection lost")

    group = GroupPublisher(one, many, max_in_flight=1, retry_alone=(ValueError,))
    first = asyncio.create_task(group.publish(_args(0)))
    await _turns()
    rest = [asyncio.create_task(group.publish(_args(n))) for n in (1, 2)]
    gate.set()
    assert await first == 0
    for task in rest:
        with pytest.raises(ConnectionResetError):
            await task
