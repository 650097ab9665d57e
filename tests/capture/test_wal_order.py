"""WAL-captured events in the same commit order as trigger-captured ones (migration 0028): each
change is stored under its source transaction's id, and the relay's ticker records a tick only
once WAL capture has appended what its snapshot sees committed, at most wal_order_wait later."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import asyncpg
import pytest

import pgferry
from pgferry import db
from pgferry.capture.wal import WalCapture, _Pending
from pgferry.log.ticker import Ticker, TickerSettings
from tests.capture.conftest import Running
from tests.helpers import eventually, read_all, tick

#: each event's commit tick: the first tick whose snapshot sees its transaction committed
COMMIT_TICKS = """
    select e.id, c.table_name as t, (e.payload->>'id')::int as n,
           (select min(k.id) from ferry.ticks k where pg_visible_in_snapshot(e.txid, k.snapshot)) as tick
    from ferry.events e join ferry.captures c on c.id = e.capture order by e.id
"""


class _Ticking:
    """The relay's ticker (ferry._tick_fenced) on a connection of its own, in the background."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = asyncio.Event()

    async def __aenter__(self) -> Ticker:
        self.conn = await db.connect(self.url)
        self.ticker = Ticker(self.conn, TickerSettings(busy_interval=0.005, idle_interval=0.05, maintain_every=3600))
        self.task = asyncio.create_task(self.ticker.run(self.stop))
        return self.ticker

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        await self.conn.close()


@pytest.fixture
async def ticking(db_url: str) -> AsyncIterator[Ticker]:
    async with _Ticking(db_url) as ticker:
        yield ticker


async def _tables(ferry: pgferry.Ferry, conn: asyncpg.Connection) -> None:
    """a by trigger, b from the WAL, one stream; a consumer of it."""
    await conn.execute("create table a (id int primary key)")
    await conn.execute("create table b (id int primary key)")
    await ferry.capture_table("a", stream="both")
    await ferry.capture_table("b", stream="both", method="wal")
    await ferry.register_consumer("c", ["both"])


async def test_a_transaction_s_trigger_and_wal_events_share_the_batch_of_its_commit(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, wal: Running, ticking: Ticker
) -> None:
    """Forty transactions, each writing both tables interleaved, a few milliseconds apart, while
    the relay's ticker runs: every event's commit tick is its transaction's, the same for its
    trigger and its WAL events, and transactions' ticks follow their commit order. Before 0028
    the WAL events came in the batch after the relay appended them, behind later transactions."""
    await _tables(ferry, conn)
    # What is tested is the shared batch, not the default wait (250 ms): under CI's parallel load
    # the first transaction's decode once took longer, and its WAL events came a batch later,
    # as documented for a wait that runs out.
    await conn.execute("update ferry.config set wal_order_wait = '5 s'")
    # WAL capture streaming and the ticker waiting for it before the first transaction: under CI's
    # load a capture slow to start left the first transaction's WAL events a tick late (as the
    # test below does it).
    await wal.caught_up(conn)

    async def waits() -> bool:
        return ticking.behind is None

    await eventually(waits, what="the ticker waiting for WAL capture")
    for n in range(40):
        async with conn.transaction():
            await conn.execute("insert into a values ($1)", 2 * n)
            await conn.execute("insert into b values ($1)", 2 * n)
            await conn.execute("insert into a values ($1)", 2 * n + 1)
            await conn.execute("insert into b values ($1)", 2 * n + 1)
        await asyncio.sleep(random.uniform(0, 0.02))
    await wal.caught_up(conn)

    async def all_ticked() -> bool:
        return all(r["tick"] is not None for r in await conn.fetch(COMMIT_TICKS))

    await eventually(all_ticked, what="a tick seeing every event")
    rows = await conn.fetch(COMMIT_TICKS)
    assert sorted((r["t"], r["n"]) for r in rows) == sorted((t, n) for t in "ab" for n in range(80))
    by_transaction = [{r["tick"] for r in rows if r["n"] // 2 == n} for n in range(40)]
    assert all(len(ticks) == 1 for ticks in by_transaction), by_transaction
    ticks = [next(iter(t)) for t in by_transaction]
    assert ticks == sorted(ticks)
    assert len(set(ticks)) > 5  # the transactions were spread over many ticks

    # A consumer gets them in that order, tick after tick, in batches of one tick or of many (a
    # batch of several ticks is ordered by commit tick, then id: by id alone, a WAL event, whose id
    # is drawn when it is appended, came after later transactions' trigger events). Transactions
    # that commit between the same two ticks are in id order among themselves.
    tick_of = {n: ticks[n] for n in range(40)}
    await tick(conn)
    for consumer, max_events in (("c", 10), ("whole", 100_000)):
        if consumer != "c":
            await ferry.register_consumer(consumer, ["both"], start_at="beginning")
        events = await read_all(ferry, conn, consumer, max_events=max_events)
        seen = [tick_of[e.payload["record"]["id"] // 2] for e in events]
        assert len(events) == 160 and seen == sorted(seen), seen


class _Held(WalCapture):
    """WAL capture whose round-ending appends wait for ``go`` (a relay slow to append)."""

    go: asyncio.Event
    holding: asyncio.Event

    async def _append(
        self, at: int, to: int, committed_at: object, pending: _Pending, round_xids: list[int] | None
    ) -> int:
        if round_xids is not None and not self.go.is_set():
            self.holding.set()
            await self.go.wait()
        return await super()._append(at, to, committed_at, pending, round_xids)  # type: ignore[arg-type]


@pytest.fixture
async def held(db_url: str) -> AsyncIterator[Running]:
    _Held.go, _Held.holding = asyncio.Event(), asyncio.Event()
    async with Running(db_url, _Held) as running:
        try:
            yield running
        finally:
            _Held.go.set()  # a test that failed before releasing it must not hang the teardown


async def test_a_tick_that_saw_a_transaction_before_its_wal_events_were_appended_gets_them_in_a_later_batch(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, held: Running
) -> None:
    """The relay appends a transaction of five WAL changes in two calls (chunks of 3); between
    them a tick taken by hand sees the transaction committed, and the consumer reads that batch.
    The three changes already stored under the source transaction's id would belong to the batch
    read: the round's end moves them to the relay's transaction, and they come next, once."""
    await _tables(ferry, conn)
    async with conn.transaction():
        await conn.execute("insert into a values (1)")
        await conn.execute("insert into b select g from generate_series(1, 5) g")
    await asyncio.wait_for(_Held.holding.wait(), 15)  # the first 3 stored, the last 2 held
    await tick(conn)
    first = await read_all(ferry, conn, "c")
    assert [(e.payload["table"], e.payload["record"]["id"]) for e in first] == [("a", 1)]
    _Held.go.set()
    await held.caught_up(conn)
    then = await read_all(ferry, conn, "c")
    assert [(e.payload["table"], e.payload["record"]["id"]) for e in then] == [("b", n) for n in range(1, 6)]
    txids = await conn.fetchval(
        "select array_agg(distinct e.txid::text::bigint order by e.txid::text::bigint) "
        "from ferry.events e join ferry.captures c on c.id = e.capture"
    )
    assert len(txids) == 2  # the source transaction's, for a; the relay's, for all of b


async def test_the_ticker_waits_for_wal_capture_at_most_wal_order_wait_then_not_until_it_catches_up(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, held: Running, ticking: Ticker
) -> None:
    """A relay that does not append (held) does not hold up the log for longer than
    wal_order_wait, once: the trigger event of the transaction comes after that, the next one
    at once, the WAL events once the relay appends them, in a later batch, none lost; then
    ticks wait for WAL capture again."""
    await conn.execute("update ferry.config set wal_order_wait = '1 s'")
    await _tables(ferry, conn)
    # WAL capture streaming and the ticker waiting for it: under CI's load, a capture slow to
    # start made the ticker fall behind (or not wait at all) before the transaction committed.
    await held.caught_up(conn)

    async def waits() -> bool:
        return ticking.behind is None

    await eventually(waits, what="the ticker waiting for WAL capture")
    async with conn.transaction():
        await conn.execute("insert into a values (1)")
        await conn.execute("insert into b select g from generate_series(1, 5) g")
    # The ticker's wait starts when a tick's snapshot first sees the commit, not when the relay
    # gets to holding: under CI's load the decode once took longer than the whole wait.
    started = asyncio.get_running_loop().time()
    got: list[pgferry.Event] = []
    async for batch in ferry.read("c", poll_interval=0.05):
        got.extend(batch.events)
        await batch.ack()
        break
    waited = asyncio.get_running_loop().time() - started
    assert [(e.payload["table"], e.payload["record"]["id"]) for e in got] == [("a", 1)]
    assert 0.9 < waited < 5, waited
    await asyncio.wait_for(_Held.holding.wait(), 15)  # held back, not merely slow to decode
    # Behind now: ticks wait for nothing until WAL capture catches up.
    assert ticking.behind is not None
    await conn.execute("insert into a values (2)")
    started = asyncio.get_running_loop().time()
    async for batch in ferry.read("c", poll_interval=0.05):
        assert [e.payload["record"]["id"] for e in batch.events] == [2]
        await batch.ack()
        break
    assert asyncio.get_running_loop().time() - started < 0.6  # not the 1 s wait
    _Held.go.set()
    await held.caught_up(conn)
    rest = await read_all(ferry, conn, "c")
    assert [(e.payload["table"], e.payload["record"]["id"]) for e in rest] == [("b", n) for n in range(1, 6)]

    await eventually(waits, what="the ticker waiting for WAL capture again")


async def test_the_ticker_does_not_wait_for_a_slot_nobody_streams(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, ticking: Ticker
) -> None:
    """WAL capture set up, no relay streaming its slot: trigger events are ticked at once."""
    await _tables(ferry, conn)
    await conn.execute("insert into a values (1)")

    async def ticked() -> bool:
        return bool(await conn.fetchval(
            "select exists (select 1 from ferry.events e, ferry.ticks k "
            "where pg_visible_in_snapshot(e.txid, k.snapshot))"
        ))  # fmt: skip

    await eventually(ticked, timeout=0.5, what="a tick seeing the event")
    assert ticking.fence is None


@pytest.mark.parametrize(
    ("low", "near", "full"),
    [
        (5, 10, 5),
        (12, 10, 12),  # newer than near: decoded before the proc array marks it committed
        (2**32 - 6, 2**32 + 4, 2**32 - 6),  # the epoch before near's
        (3, 2**32 - 2, 2**32 + 3),  # the epoch after near's
        (2**32 - 1, 5 * 2**32, 5 * 2**32 - 1),
        (2**31 + 9, 10, 2**31 + 9),  # 2^31 - 1 after: still the nearest
        (2**31 + 11, 10, 2**31 + 11 - 2**32),  # 2^31 + 1 after: 2^31 - 1 before is nearer, and no id
    ],
)
async def test_a_wal_transaction_id_is_widened_to_the_nearest_one(
    conn: asyncpg.Connection, low: int, near: int, full: int
) -> None:
    """pgoutput gives 32 bits; the source transaction may be newer than the relay's own (a round
    stays open across many) and than a snapshot's xmax, so it is widened to the nearest id."""
    if full < 0:
        with pytest.raises(asyncpg.PostgresError):  # no such id: not one pgoutput sends
            await conn.fetchval("select ferry._full_xid($1, $2::text::xid8)::text::bigint", low, str(near))
        return
    assert await conn.fetchval("select ferry._full_xid($1, $2::text::xid8)::text::bigint", low, str(near)) == full


async def test_the_wal_insert_position_is_where_the_next_record_starts_or_its_page_s_start(
    conn: asyncpg.Connection,
) -> None:
    """At most a page header (24 or 40 bytes) before pg_current_wal_insert_lsn(), never after."""
    behind = await conn.fetchval("select pg_current_wal_insert_lsn() - ferry._wal_insert_position()")
    assert 0 <= behind <= 40


async def test_a_change_moved_to_a_later_batch_takes_the_later_changes_of_its_round_with_it(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str
) -> None:
    """Found from outside by killing the relay (SIGKILL) under writers: two updates of one row
    committed while nobody decoded; a tick recorded in between sees the first, so the relay
    stores it under its own transaction, in a later batch. The ticker, back, took a fence that
    sees the second but not that transaction: recorded as it was, the second update came in a
    batch before the first. A round that moves changes so makes the ticker take its fence again."""
    await conn.execute("create table k (id int primary key, v int)")
    await ferry.capture_table("k", stream="k", method="wal")
    await ferry.register_consumer("c", ["k"])
    await conn.execute("insert into k values (1, 1)")
    await ferry.publish("other", {})  # something new for the tick to record
    await tick(conn)  # sees the insert committed: its change will come after this batch
    await conn.execute("update k set v = 2 where id = 1")
    _Held.go, _Held.holding = asyncio.Event(), asyncio.Event()
    async with Running(db_url, _Held) as held:
        await asyncio.wait_for(_Held.holding.wait(), 15)  # both changes stored, the round's end held

        async def streaming() -> bool:
            return bool(await conn.fetchval("select bool_or(s.active) from pg_replication_slots s "
                                            "join ferry.wal_slot w using (slot_name)"))  # fmt: skip

        await eventually(streaming, what="the slot streamed")
        async with _Ticking(db_url) as ticker:
            await eventually(lambda: asyncio.sleep(0, ticker.fence is not None), what="a fence taken")
            _Held.go.set()
            await held.caught_up(conn)

            async def all_ticked() -> bool:
                return all(r["tick"] is not None for r in await conn.fetch(COMMIT_TICKS))

            await eventually(all_ticked, what="a tick seeing every event")
    events = await read_all(ferry, conn, "c")
    assert [(e.payload["type"], e.payload["record"]["v"]) for e in events] == [("INSERT", 1), ("UPDATE", 2)]
