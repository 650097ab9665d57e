"""Batch reads bounded in bytes (ferry.webhook_steps' max_bytes, due_retries' bound; migrations 0015, 0017).

Driven in SQL the way the worker drives it: read, acknowledge, read on (a
part of a range continues with peek_until and resume_after), so that the
rule itself is checked: nothing lost or repeated, every read within the
bound unless it is one event, and batches that keep commit order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
import click
import pytest

from pgferry import sql
from pgferry.cli.common import ByteSize
from pgferry.delivery.context import DeliveryContext
from pgferry.relay.process import RelaySettings
from tests.helpers import tick, webhook_steps

BOUND = 10_000


@dataclass
class Read:
    start: int
    end: int
    cut_after: int | None
    ids: list[int] = field(default_factory=list)
    bytes: int = 0


async def step(
    conn: asyncpg.Connection,
    max_bytes: int | None,
    *requests: tuple[str, int | None, tuple[int, int] | None],
) -> list[asyncpg.Record]:
    """ferry.webhook_steps reading for each (consumer, peek_after, resume), acknowledging nothing;
    the consumers are those of subscriptions of the same name, or of none ('c': all streams)."""
    return await webhook_steps(
        conn, [r[0].removeprefix("webhook:") for r in requests], [r[0] for r in requests],
        peek_after=[r[1] for r in requests], max_bytes=max_bytes,
        peek_until=[r[2][0] if r[2] else None for r in requests],
        resume_after=[r[2][1] if r[2] else None for r in requests],
    )  # fmt: skip


def as_read(rows: list[asyncpg.Record]) -> Read:
    head = rows[0]
    read = Read(head["start_tick"], head["end_tick"], head["cut_after"])
    for r in rows:
        if r["id"] is not None:
            read.ids.append(r["id"])
            read.bytes += len(r["payload"].encode()) + len((r["headers"] or "").encode())
    return read


async def acknowledge(conn: asyncpg.Connection, consumer: str, read: Read) -> tuple[int, tuple[int, int] | None]:
    """As the worker does: a part moves no cursor (start -> start); the read that ends the range
    moves it. Returns where the next read starts and resumes."""
    to = read.end if read.cut_after is None else read.start
    await conn.execute(sql.query("advance_consumer"), consumer, read.start, to)
    return to, None if read.cut_after is None else (read.end, read.cut_after)


async def drain(
    conn: asyncpg.Connection, max_bytes: int | None, consumer: str = "c", resume: tuple[int, int] | None = None
) -> list[Read]:
    """Every read of ``consumer`` until nothing is new, acknowledged as the worker does."""
    reads: list[Read] = []
    cursor = await conn.fetchval("select tick_id from ferry.consumers where name = $1", consumer)
    while True:
        rows = await step(conn, max_bytes, (consumer, cursor, resume))
        if not rows:
            return reads
        reads.append(as_read(rows))
        cursor, resume = await acknowledge(conn, consumer, reads[-1])


async def commit_ticks(conn: asyncpg.Connection) -> dict[int, int]:
    """Each event's commit tick: the first tick whose snapshot sees its transaction committed."""
    rows = await conn.fetch(
        """select e.id, (select min(t.id) from ferry.ticks t where pg_visible_in_snapshot(e.txid, t.snapshot)) as t
           from ferry.events e"""
    )
    return {r["id"]: r["t"] for r in rows}


async def publish(conn: asyncpg.Connection, size: int, n: int = 1) -> None:
    await conn.execute(
        """select ferry.publish_many(array_fill('s'::text, array[$2::int]),
                                     array_fill(jsonb_build_object('p', repeat('x', $1::int)), array[$2::int]))""",
        size, n,
    )  # fmt: skip


def check(reads: list[Read], ticks: dict[int, int], max_bytes: int) -> list[int]:
    """The invariants of bounded reads; returns the ids in delivery order."""
    order = [i for r in reads for i in r.ids]
    assert sorted(order) == sorted(ticks), "every event exactly once"
    assert len(order) == len(set(order))
    for r in reads:
        assert r.bytes <= max_bytes or len(r.ids) == 1, f"a read over the bound holds one event: {r}"
    # Ranges follow each other; parts of a range come in id order; each event belongs to its range.
    start = reads[0].start
    pending: list[int] = []
    for r in reads:
        assert r.start == start
        pending.extend(r.ids)
        if r.cut_after is None:
            assert pending == sorted(pending)
            assert all(start < ticks[i] <= r.end for i in pending), "events of a batch committed in its range"
            start, pending = r.end, []
    assert not pending
    return order


async def test_a_byte_bound_cuts_batches_at_ticks_without_losing_or_repeating_events(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    other = await asyncpg.connect(db_url)
    try:
        for _ in range(6):  # small ticks: the bound ends reads at tick boundaries
            await publish(conn, 3_000)
            await tick(conn)
        # Interleaved transactions: ids drawn in one order, committed in the other.
        early = other.transaction()
        await early.start()
        await publish(other, 2_500, 2)
        await publish(conn, 2_500, 2)
        await tick(conn)
        await early.commit()
        await publish(conn, 4_000, 7)  # one transaction over the bound: read in parts
        await tick(conn)
        await publish(conn, 1_000, 3)
        await tick(conn)
    finally:
        await other.close()
    ticks = await commit_ticks(conn)
    reads = await drain(conn, BOUND)
    check(reads, ticks, BOUND)
    assert any(r.cut_after is not None for r in reads), "a transaction over the bound is read in parts"
    whole = await drain_all_at_once(conn)
    assert whole == [], "the cursor ended past every event"


async def drain_all_at_once(conn: asyncpg.Connection) -> list[int]:
    reads = await drain(conn, None)
    return [i for r in reads for i in r.ids]


async def test_an_event_larger_than_the_bound_goes_alone(conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    await publish(conn, 500)
    await publish(conn, 50_000)
    await publish(conn, 500, 3)
    await tick(conn)
    ticks = await commit_ticks(conn)
    reads = await drain(conn, BOUND)
    order = check(reads, ticks, BOUND)
    big = [r for r in reads if r.bytes > BOUND]
    assert len(big) == 1 and len(big[0].ids) == 1
    assert order == sorted(ticks)  # one tick: id order


async def test_the_bound_counts_only_the_events_a_read_returns(conn: asyncpg.Connection) -> None:
    # Events a subscription's filter (or its partition) leaves out are not rendered, and take
    # none of its bound: half of ten 1.5 KB events pass, and they fit in one 10 KB read.
    await conn.execute("select ferry.subscribe('f', array['s'], 'http://127.0.0.1:9/', filter => '$.keep == true')")
    await conn.execute(
        """select ferry.publish_many(array_fill('s'::text, array[10]),
                                     array(select jsonb_build_object('keep', g % 2 = 0, 'p', repeat('x', 1500))
                                           from generate_series(1, 10) g))"""
    )
    await tick(conn)
    reads = await drain(conn, BOUND, "webhook:f")
    assert [(len(r.ids), r.cut_after) for r in reads] == [(5, None)], reads
    kept = await conn.fetch("select id from ferry.events where (payload ->> 'keep')::boolean order by id")
    assert reads[0].ids == [r["id"] for r in kept]


async def test_a_read_cut_at_a_tick_looks_for_the_tick_once(conn: asyncpg.Connection) -> None:
    # ferry._batch_split searches the range's ticks (a scan of events per step): its result is
    # used in several places of the read's statement, which must not call it for each.
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    for _ in range(6):
        await publish(conn, 3_000)
        await tick(conn)
    async with conn.transaction():
        await conn.execute("set local track_functions = 'pl'")
        read = as_read(await step(conn, BOUND, ("c", None, None)))
        calls = await conn.fetchval(
            "select calls from pg_stat_xact_user_functions where schemaname = 'ferry' and funcname = '_batch_split'"
        )
    assert len(read.ids) == 3 and read.cut_after is None, read
    assert calls == 1


async def test_a_part_of_a_range_cut_inside_one_transaction_keeps_the_cursor(conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    start = await conn.fetchval("select tick_id from ferry.consumers where name = 'c'")
    await publish(conn, 4_000, 5)
    await tick(conn)
    rows = await step(conn, BOUND, ("c", None, None))
    assert len(rows) == 3 and rows[0]["cut_after"] == rows[1]["id"] and rows[0]["more"] and rows[2]["id"] is None
    assert rows[0]["start_tick"] == start
    # Read on: the rest of the range, then it ends.
    rest = await step(conn, BOUND, ("c", start, (rows[0]["end_tick"], rows[0]["cut_after"])))
    assert [r["id"] for r in rest] == [rows[1]["id"] + 1, rows[1]["id"] + 2, None]  # and its range's row


async def test_a_range_that_is_one_huge_tick_is_read_in_parts_of_a_bounded_count(
    conn: asyncpg.Connection, db_url: str
) -> None:
    # As after a relay was down: no tick between thousands of events. Each part builds only its
    # own events (quadratic otherwise); a part takes at most 4 x max_batch_events of them.
    await conn.execute("update ferry.config set max_batch_events = 10")
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    other = await asyncpg.connect(db_url)
    try:
        early = other.transaction()
        await early.start()
        await publish(other, 100, 30)  # ids drawn first, committed last
        for _ in range(5):
            await publish(conn, 100, 25)
        await early.commit()
    finally:
        await other.close()
    await tick(conn)
    ticks = await commit_ticks(conn)
    reads = await drain(conn, BOUND * 100)
    order = check(reads, ticks, BOUND * 100)
    assert order == sorted(ticks), "one range: id order"
    assert [len(r.ids) for r in reads] == [40, 40, 40, 35]
    assert [r.cut_after is not None for r in reads] == [True, True, True, False]


async def test_large_events_of_one_tick_are_read_in_parts_without_rendering_the_rest_of_the_range(
    conn: asyncpg.Connection,
) -> None:
    """An outside probe: 2,000 rows of 800 KB, 20 to a transaction, one range, arrived at ~0.7 rows/s:
    each bounded read rendered every event left in its range before the bound stopped it. A read
    renders now only while the stored size of the events before one is within 4 x the bound, and
    keeps the first past it unrendered and not taken: it is cut there, nothing lost or repeated.
    Incompressible payloads (random text): their stored size is about their size."""
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    await conn.execute(
        """select ferry.publish_many(array_fill('s'::text, array[30]),
                  array(select jsonb_build_object('n', g, 'p', (select string_agg(md5(random()::text || g || h), '')
                                                                from generate_series(1, 600) h))
                        from generate_series(1, 30) g))"""
    )  # 30 events of ~19 KB in one transaction and one tick
    await tick(conn)
    ticks = await commit_ticks(conn)
    bound = 40_000  # two events a read; past 160,000 stored bytes (8 events) nothing is rendered
    reads = await drain(conn, bound)
    order = check(reads, ticks, bound)
    assert order == sorted(ticks) and len(order) == 30
    assert [len(r.ids) for r in reads] == [2] * 15, [len(r.ids) for r in reads]


async def ack_part(conn: asyncpg.Connection, consumer: str, read: Read) -> None:
    """Acknowledges a part the way the worker does (cursor stays at its start), with its progress."""
    await webhook_steps(
        conn, [consumer], [consumer], ack_from=[read.start], ack_to=[read.start], peeks=[False],
        max_bytes=BOUND * 100, ack_part_end=[read.end], ack_part_done=[read.cut_after],
    )  # fmt: skip


async def test_a_worker_starting_over_resumes_a_range_after_its_last_acknowledged_part(
    conn: asyncpg.Connection,
) -> None:
    # After an outage all the backlog is one tick; a worker that failed in the middle of it sent
    # every part again (21,004 duplicates after a 90 s outage, outside probe). Now the parts
    # acknowledged are kept with the cursor (migration 0023) and a read from the cursor resumes.
    await conn.execute("update ferry.config set max_batch_events = 10")
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    start = await conn.fetchval("select tick_id from ferry.consumers where name = 'c'")
    await publish(conn, 100, 100)
    await tick(conn)
    first = as_read(await step(conn, BOUND * 100, ("c", None, None)))
    second = as_read(await step(conn, BOUND * 100, ("c", start, (first.end, first.cut_after or 0))))
    assert first.cut_after is not None and second.cut_after is not None
    await ack_part(conn, "c", first)
    await ack_part(conn, "c", second)
    # A new worker reads from the cursor: the third part, not the first again.
    again = as_read(await step(conn, BOUND * 100, ("c", None, None)))
    assert again.start == start and again.ids[0] == second.ids[-1] + 1, (again.ids[:3], second.ids[-1])
    assert again.ids == sorted(again.ids) and len(again.ids) == 20  # the rest: 100 - 2 x 40
    # Once the cursor moves on, by any path, the progress is gone with the tick it belonged to.
    await conn.execute("select ferry.advance_consumer('c', $1, $2)", start, again.end)
    kept = await conn.fetchrow("select part_start, part_end, part_done from ferry.consumers where name = 'c'")
    assert tuple(kept) == (None, None, None)
    await conn.execute("update ferry.consumers set tick_id = $1 where name = 'c'", start)  # rewound, as a replay may
    whole = as_read(await step(conn, BOUND * 100, ("c", None, None)))
    assert whole.ids[0] == first.ids[0], "a rewound cursor reads the range from its start"


async def test_bad_byte_bounds_are_refused_with_their_sqlstate(conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.register_consumer('c', null, 'beginning')")
    with pytest.raises(asyncpg.PostgresError, match="max_bytes must be positive") as raised:
        await step(conn, 0, ("c", None, None))
    assert raised.value.sqlstate == "22023"
    with pytest.raises(asyncpg.PostgresError, match="resume_after needs peek_after and peek_until") as raised:
        await webhook_steps(conn, ["nosub"], ["c"], max_bytes=100, resume_after=[5])
    assert raised.value.sqlstate == "22023"


async def test_due_retries_stop_at_the_byte_bound_but_take_one_event_however_large(conn: asyncpg.Connection) -> None:
    await conn.execute("select ferry.subscribe('hook', array['s'], 'http://127.0.0.1:9/hook')")
    sizes = [3_000, 3_000, 3_000, 30_000, 100]
    await conn.execute(
        """insert into ferry.retries (subscription, event_id, stream, key, payload, event_created_at, attempts,
                                      next_attempt_at)
           select 'hook', n, 's', null, jsonb_build_object('p', repeat('x', s)), now(), 1, now() - interval '1 s'
           from unnest($1::int[]) with ordinality as u(s, n)""",
        sizes,
    )

    async def due(bound: int | None, after: int = 0) -> list[int]:
        rows = await conn.fetch(sql.query("due_retries"), "hook", False, 1000, bound, 0, 1)
        ids = [r["id"] for r in rows if r["id"] > after]
        await conn.execute("delete from ferry.retries where event_id = any($1::bigint[])", ids)
        return ids

    assert await due(BOUND) == [1, 2, 3]
    assert await due(BOUND) == [4]  # over the bound, alone
    assert await due(BOUND) == [5]
    assert await conn.fetchval("select count(*) from ferry.retries") == 0


def test_byte_sizes_take_units_and_refuse_what_is_not_a_positive_size() -> None:
    size = ByteSize()
    assert size.convert("16MB", None, None) == 16 << 20
    assert size.convert("512kb", None, None) == 512 << 10
    assert size.convert("1000", None, None) == 1000
    for bad in ("0", "-5MB", "12QB", "MB", "1.5GB"):
        with pytest.raises(click.BadParameter):
            size.convert(bad, None, None)
    with pytest.raises(ValueError, match="max_batch_bytes must be at least 3"):
        RelaySettings(max_batch_bytes=2)
    ctx = DeliveryContext(pool=None, http=None, global_limit=None, max_batch_bytes=16 << 20)  # type: ignore[arg-type]
    assert ctx.read_bytes == (16 << 20) // 3  # a third each: two batches in flight and a retry round


async def fill_mixed(conn: asyncpg.Connection, db_url: str) -> None:
    """Small ticks, interleaved transactions, one transaction over the bound, on streams s and t."""
    other = await asyncpg.connect(db_url)
    try:
        for _ in range(4):
            await publish(conn, 3_000)
            await tick(conn)
        early = other.transaction()
        await early.start()
        await publish(other, 2_500, 2)
        await publish(conn, 2_500, 2)
        await tick(conn)
        await early.commit()
        await publish(conn, 4_000, 7)  # read in parts
        await conn.execute(
            """select ferry.publish_many(array_fill('t'::text, array[3]),
                                         array_fill(jsonb_build_object('p', repeat('y', 2000)), array[3]))"""
        )
        await tick(conn)
        await publish(conn, 1_000, 3)
        await tick(conn)
    finally:
        await other.close()


async def test_subscriptions_at_one_position_share_bounded_reads_and_their_parts(
    conn: asyncpg.Connection, db_url: str
) -> None:
    """Three subscriptions at one position (two on s, one on s and t), stepping together, share
    every read, including the parts of a range (the bound counts the events of both streams);
    each gets every event of its streams once, within the bound, in commit order."""
    subs = (("a", ["s"]), ("b", ["s"]), ("st", ["s", "t"]))
    for name, on in subs:
        await conn.execute("select ferry.subscribe($1, $2, 'http://127.0.0.1:9/x')", name, on)
    await fill_mixed(conn, db_url)
    all_ticks = await commit_ticks(conn)
    streams = dict(await conn.fetch("select id, stream from ferry.events"))
    cursor = await conn.fetchval("select tick_id from ferry.consumers where name = 'webhook:a'")
    resume: tuple[int, int] | None = None
    reads: dict[str, list[Read]] = {name: [] for name, _ in subs}
    while rows := await step(conn, BOUND, *((f"webhook:{name}", cursor, resume) for name, _ in subs)):
        assert {tuple(r["reqs"]) for r in rows} <= {(1, 2, 3), (3,)}, "one shared read"
        for i, (name, _) in enumerate(subs, 1):
            reads[name].append(as_read([r for r in rows if i in r["reqs"]]))
            cursor, resume = await acknowledge(conn, f"webhook:{name}", reads[name][-1])
    for name, on in subs:
        check(reads[name], {i: t for i, t in all_ticks.items() if streams[i] in on}, BOUND)
    assert any(r.cut_after is not None for r in reads["a"]), "a shared range read in parts"
    assert any(streams[i] == "t" for r in reads["st"] for i in r.ids)


async def test_a_subscription_that_falls_out_of_step_reads_the_rest_of_a_shared_range_alone(
    conn: asyncpg.Connection, db_url: str
) -> None:
    """a and b read a part of a range together; a reads on alone, then b alone, each from the part's
    end; a third, on s and t, shares their reads (the same position) and reads on alone as well.
    Nothing is lost or repeated."""
    for name, on in (("a", ["s"]), ("b", ["s"]), ("st", ["s", "t"])):
        await conn.execute("select ferry.subscribe($1, $2, 'http://127.0.0.1:9/x')", name, on)
    await publish(conn, 500)
    await tick(conn)
    await publish(conn, 4_000, 5)  # one transaction over the bound
    await tick(conn)
    await fill_mixed(conn, db_url)
    all_ticks = await commit_ticks(conn)
    streams = dict(await conn.fetch("select id, stream from ferry.events"))
    first_reads: dict[str, list[Read]] = {}
    resumes: dict[str, tuple[int, int] | None] = {}
    for _ in range(2):  # the first range whole, then the first part of the second, all three stepping together
        rows = await step(conn, BOUND, *((f"webhook:{n}", None, None) for n in ("a", "b", "st")))
        assert {tuple(r["reqs"]) for r in rows} == {(1, 2, 3)}, "one shared read (nothing on t yet)"
        for i, name in enumerate(("a", "b", "st"), 1):
            read = as_read([r for r in rows if i in r["reqs"]])
            first_reads.setdefault(name, []).append(read)
            _, resumes[name] = await acknowledge(conn, f"webhook:{name}", read)
    assert resumes["a"] is not None and resumes["a"] == resumes["b"] == resumes["st"], "a part read together"
    for name, wanted in (("a", {"s"}), ("b", {"s"}), ("st", {"s", "t"})):
        reads = first_reads[name] + await drain(conn, BOUND, f"webhook:{name}", resumes[name])
        check(reads, {i: t for i, t in all_ticks.items() if streams[i] in wanted}, BOUND)
