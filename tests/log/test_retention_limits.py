"""Bounded retention (migration 0014): a consumer nobody reads cannot pin the log forever.

Retention is driven fast as in test_retention.py (rotation_interval 0 s,
ferry.maintain called by hand); "time passes" for a stuck consumer by ageing
the ticks its cursor has not passed, so no test sleeps through a limit.
"""

from __future__ import annotations

import asyncio
import os

import asyncpg
import pytest

import pgferry
from pgferry.errors import ConsumerStalled, PgferryError
from pgferry.receiver import Receiver, Respond, Slow
from tests.helpers import MakeReceiver, RunningRelay, eventually, read_all, tick


async def maintain(conn: asyncpg.Connection) -> list[str]:
    return list(await conn.fetchval("select ferry.maintain()"))


async def age_ticks(conn: asyncpg.Connection, by: str = "2 hours") -> None:
    """Make every tick so far look ``by`` older: whoever has not passed them has a cursor that old."""
    await conn.execute(f"update ferry.ticks set created_at = created_at - interval '{by}'")


async def level(conn: asyncpg.Connection, consumer: str) -> str:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "select level from ferry.retention_status() where consumer = $1", consumer
    )


#: bytes the partitions of ferry.events take on disk (tables, TOAST and indexes)
EVENTS_SIZE = (
    "select sum(pg_total_relation_size(i.inhrelid)) from pg_inherits i where i.inhparent = 'ferry.events'::regclass"
)


async def fast_rotation(conn: asyncpg.Connection, max_retention: str = "1 hour") -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await conn.execute("select ferry.set_retention($1::text::interval)", max_retention)


async def test_a_stuck_consumer_is_stalled_the_log_stays_bounded_and_its_gap_counts_what_it_lost(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await fast_rotation(conn)
    await ferry.register_consumer("stuck", ["s"])
    await ferry.register_consumer("live", ["s"])
    await ferry.register_consumer("other", ["t"])
    written_s: list[int] = []
    written_t: list[int] = []
    got_live: list[int] = []
    got_other: list[int] = []
    retained_max = 0
    sizes: list[int] = []
    said: list[str] = []
    for round_ in range(8):
        # ~2 KB each, incompressible: 8 rounds would take ~160 kB more on disk if nothing were truncated
        written_s += [await ferry.publish("s", {"n": n, "pad": os.urandom(1000).hex()}) for n in range(10)]
        written_t += [await ferry.publish("t", {"n": n}) for n in range(5)]
        if round_ == 1:
            await age_ticks(conn)  # the stuck consumer's cursor is now 2 hours old
        got_live += [e.id for e in await read_all(ferry, conn, "live")]
        got_other += [e.id for e in await read_all(ferry, conn, "other")]
        said += await maintain(conn)
        said += await maintain(conn)  # close what the first call rotated away from
        retained_max = max(retained_max, await conn.fetchval("select count(*) from ferry.events"))
        sizes.append(int(await conn.fetchval(EVENTS_SIZE)))

    assert got_live == written_s, "a consumer within the limit must get every event"
    assert got_other == written_t
    assert any(m.startswith("stalled: consumer stuck is over the retention limit") for m in said), said
    assert sum(1 for m in said if "truncated" in m) >= 4, "partitions must keep being truncated"
    assert retained_max <= 3 * 15 + 15, f"the log grew to {retained_max} events"
    # ... and in bytes: what the partitions take stays what the first round's writes took (measured:
    # 128 kB every round, one partition with a round's events, two truncated to their index pages)
    assert max(sizes) <= 1.5 * sizes[0], f"the events partitions grew from {sizes[0]} to {max(sizes)} bytes"
    assert not any("live" in m or "other" in m for m in said if m.startswith(("stalled", "gap", "warning"))), said

    gaps = await ferry.gaps("stuck")
    assert len(gaps) == 1, "successive truncations under a consumer that reads nothing extend one gap"
    assert gaps[0]["cause"] == "retention"
    lost = gaps[0]["events"]
    assert 0 < lost < len(written_s)
    assert gaps[0]["first_event_id"] == written_s[0]
    row = next(r for r in await ferry.retention() if r["consumer"] == "stuck")
    assert row["level"] == "stalled" and row["gap_events"] == lost

    with pytest.raises(ConsumerStalled, match=rf"consumer 'stuck' is stalled: retention dropped {lost} event"):
        await read_all(ferry, conn, "stuck")
    assert await ferry.resume_consumer("stuck", "retained") == 0
    rest = [e.id for e in await read_all(ferry, conn, "stuck")]
    assert rest == written_s[lost:], "after the gap it reads every event still retained, in order"
    assert await level(conn, "stuck") == "ok"


async def test_a_subscription_stalled_while_changing_partitions_counts_each_lost_event_once(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """The old partition drains up to the change's tick, the new ones start there: what retention
    drops under them is each one's own part, never counted twice (an outside probe: 1,583 events
    written, 2,931 in gaps, the drained partition counting those after its drain_to too)."""
    await fast_rotation(conn)
    subscribe = "select ferry.subscribe('dd', array['s'], 'http://127.0.0.1:9/', partitions => $1)"
    await conn.execute(subscribe, 1)
    written = [await ferry.publish("s", {"n": n}, key=f"k{n % 7}") for n in range(10)]
    await tick(conn)
    await conn.execute(subscribe, 2)  # no relay: the old partition never drains
    written += [await ferry.publish("s", {"n": n}, key=f"k{n % 7}") for n in range(10, 40)]
    await tick(conn)
    await age_ticks(conn)
    for _ in range(3):
        await maintain(conn)
        await tick(conn)
    assert await conn.fetchval("select count(*) from ferry.events where id = any ($1::bigint[])", written) == 0
    gaps = {g["consumer"]: g["events"] for g in await ferry.gaps()}
    assert set(gaps) == {"webhook:dd", "webhook:dd#0/2", "webhook:dd#1/2"}, gaps
    assert gaps["webhook:dd"] == 10 and sum(gaps.values()) == len(written), gaps


async def test_a_subscription_stalled_while_it_delivers_stops_sending_what_became_a_gap(
    relay: RunningRelay, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """A slow subscription behind the limit has a round of events in hand when retention counts them
    lost: it stops sending them at once (it went on for seconds, each one counted in the gap and
    received: an outside probe had 42 such events)."""
    receiver, url = await receiver_factory(lambda request: Slow(0.2, Respond()))
    await conn.execute("select ferry.subscribe('slow', array['s'], $1, batch_size => 1, max_in_flight => 1)", url)
    await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(1, 100) g")
    await eventually(lambda: _received(receiver, 3), what="the round under way")
    await fast_rotation(conn)
    await age_ticks(conn)
    said: list[str] = []
    for _ in range(6):  # rotate, close, truncate
        said += await maintain(conn)
        await tick(conn)
        if any(m.startswith("gap: consumer webhook:slow") for m in said):
            break
    else:
        raise AssertionError(said)
    at_gap = len(receiver.received)
    await asyncio.sleep(1.5)  # 7 more requests of 0.2 s each if it went on
    assert len(receiver.received) - at_gap <= 1, "only the request on the wire may still arrive"


async def _received(receiver: Receiver, n: int) -> bool:
    return len(receiver.received) >= n


async def test_a_stalled_consumer_that_catches_up_before_anything_goes_is_unmarked(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("select ferry.set_retention('1 hour')")
    await ferry.register_consumer("slow")
    first = await ferry.publish("s", {})
    await tick(conn)
    await age_ticks(conn)
    assert any(m.startswith("stalled: consumer slow") for m in await maintain(conn))
    assert [e.id for e in await read_all(ferry, conn, "slow")] == [first]  # nothing lost: reads on
    assert "consumer slow is back within the retention limit before anything was skipped" in await maintain(conn)
    assert await ferry.gaps() == []


async def test_warnings_at_half_and_four_fifths_of_the_limit_name_the_consumer_once_each(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("select ferry.set_retention('10 hours')")
    await ferry.register_consumer("lagging")
    await ferry.register_consumer("fine")
    await ferry.publish("s", {})
    await tick(conn)
    assert not [m for m in await maintain(conn) if m.startswith("warning")]
    await read_all(ferry, conn, "fine")
    await age_ticks(conn, "5 hours 30 minutes")
    said = await maintain(conn)
    assert [m for m in said if m.startswith("warning")] == [m for m in said if "lagging" in m], (
        "fine is at the newest tick"
    )
    assert len([m for m in said if m.startswith("warning: consumer lagging holds the log back")]) == 1, said
    assert any("(55% of max_retention 10:00:00)" in m for m in said), said
    assert await level(conn, "lagging") == "50%"
    assert not [m for m in await maintain(conn) if m.startswith("warning")], "said once, not every round"
    await age_ticks(conn, "3 hours")
    said = await maintain(conn)
    assert any(m.startswith("warning: consumer lagging") and "85%" in m for m in said), said
    assert await level(conn, "lagging") == "80%"
    await read_all(ferry, conn, "lagging")
    assert "consumer lagging is back under 50% of the retention limit" in await maintain(conn)


async def test_the_size_cap_stalls_the_consumer_holding_the_oldest_partition(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    await conn.execute("update ferry.config set rotation_interval = '0 s', idle_tick_interval = '0 s'")
    await conn.execute("select ferry.set_retention('7 days', 100000)")
    await ferry.register_consumer("stuck")
    await ferry.register_consumer("live")
    ids = [await ferry.publish("s", {"pad": os.urandom(750).hex()}) for _ in range(80)]  # ~130 kB, incompressible
    said = await maintain(conn) + await maintain(conn)
    assert not any(m.startswith("stalled") for m in said), "nothing is stalled while no closed partition may go"
    await read_all(ferry, conn, "live")
    rows = {r["consumer"]: r for r in await ferry.retention()}
    assert rows["stuck"]["held_bytes"] > 0 and rows["live"]["held_bytes"] == 0
    assert rows["stuck"]["size_pct"] > 100 and rows["live"]["size_pct"] == 0
    said = await maintain(conn)
    assert any(m.startswith("stalled: consumer stuck holds partition 0 back") for m in said), said
    assert any(m.startswith(f"gap: consumer stuck (stalled) never gets {len(ids)} event(s)") for m in said), said
    assert "partition 0 truncated" in said
    assert (await ferry.gaps("stuck"))[0]["events"] == len(ids)
    assert (await ferry.gaps("live")) == []


async def test_a_consumer_that_keeps_up_is_not_warned_of_a_partition_that_just_closed(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Every consumer holds the partition that just closed until its next tick: that is not holding
    the log back (an outside probe saw a caught-up subscription at "80%" of the size cap)."""
    await fast_rotation(conn, "2 hours")
    await conn.execute("select ferry.set_retention('2 hours', 1)")  # any log is over a 1-byte cap
    await ferry.register_consumer("keeps_up", ["s"])
    await ferry.publish("s", {})
    await tick(conn)
    await read_all(ferry, conn, "keeps_up")
    said = await maintain(conn) + await maintain(conn)
    assert await conn.fetchval("select count(*) from ferry.partitions where state = 'closed'") == 1, said
    # Not in the call that closed it either (a second outside probe: every caught-up consumer warned
    # at 80%, then "back under 50%" 5 s later, at every partition close).
    assert not [m for m in said if m.startswith("warning") or "back under" in m], said
    await conn.execute("update ferry.config set rotation_interval = '1 hour'")
    row = next(r for r in await ferry.retention() if r["consumer"] == "keeps_up")
    assert (row["level"], row["held_bytes"], row["size_pct"]) == ("ok", 0, 0)


async def test_retention_limits_refuse_bad_input_with_clear_errors(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    cases = [
        ("-1 day", None, "max_retention must be a positive interval"),
        ("0 s", None, "max_retention must be a positive interval"),
        ("1 minute", None, r"max_retention \(00:01:00\) must be at least rotation_interval \(00:05:00\)"),
        ("7 days", 0, "max_retention_bytes must be a positive number of bytes or NULL"),
        ("7 days", -5, "max_retention_bytes must be a positive number of bytes or NULL"),
        ("a week", None, "invalid input syntax for type interval"),
    ]
    for max_retention, max_bytes, message in cases:
        with pytest.raises(PgferryError, match=message):
            await ferry.set_retention(max_retention, max_bytes)
    try:
        await conn.execute("select ferry.set_retention('-1 day')")
    except asyncpg.PostgresError as exc:
        assert exc.sqlstate == "22023"
    with pytest.raises(PgferryError, match="from_position must be 'retained'"):
        await ferry.resume_consumer("nobody", "yesterday")
    with pytest.raises(PgferryError, match="consumer 'nobody' does not exist"):
        await ferry.resume_consumer("nobody", "now")
    with pytest.raises(asyncpg.CheckViolationError, match="max_retention_positive"):
        await conn.execute("update ferry.config set max_retention = '-1 s'")


async def test_a_stalled_consumer_is_unmarked_only_under_half_the_limit(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Outside probe: a consumer that reads nothing, moved by each truncation to the oldest tick left
    (near the limit while another consumer held the log), was unmarked and stalled again every few
    seconds, a warning and a flip of pgferry_consumer_stalled each time."""
    await conn.execute("select ferry.set_retention('1 hour')")
    await ferry.register_consumer("quiet")
    await ferry.publish("s", {})
    await tick(conn)
    await age_ticks(conn)
    assert any(m.startswith("stalled: consumer quiet") for m in await maintain(conn))
    await conn.execute("update ferry.ticks set created_at = now() - interval '40 minutes'")  # 67%
    said = await maintain(conn)
    assert not any("quiet is back" in m for m in said) and await level(conn, "quiet") == "stalled", said
    await conn.execute("update ferry.ticks set created_at = now() - interval '20 minutes'")  # 33%
    assert "consumer quiet is back within the retention limit before anything was skipped" in await maintain(conn)


async def test_closed_partitions_are_truncated_oldest_first_so_a_gap_moves_the_cursor(
    ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Outside probe: a newer closed partition truncated before an older one moved a stalled
    consumer's cursor to the older one's first tick, about to go: gaps "from tick N to N"."""
    await fast_rotation(conn)
    await ferry.register_consumer("live", ["s"])
    for _ in range(4):  # around the ring of partitions once: the next ones to close are 2, then 0
        await ferry.publish("s", {})
        await read_all(ferry, conn, "live")
        await maintain(conn)
        await maintain(conn)
    await ferry.register_consumer("stuck", ["s"])
    for _ in range(2):
        await ferry.publish("s", {})
        await read_all(ferry, conn, "live")
        await maintain(conn)
        await maintain(conn)
    await age_ticks(conn)
    # Scanned without an order, the older partition's row came after the newer one's once it had
    # been updated since (a row's new version goes where there is room).
    oldest = await conn.fetchval("select part from ferry.partitions where state = 'closed' order by closed_at limit 1")
    await conn.execute("update ferry.partitions set state = state where part = $1", oldest)
    said = await maintain(conn)
    assert len([m for m in said if m.endswith("truncated")]) == 2, said
    gaps = await conn.fetch("select from_tick, to_tick from ferry.gaps where consumer = 'stuck'")
    assert gaps and all(g["from_tick"] < g["to_tick"] for g in gaps), (gaps, said)
