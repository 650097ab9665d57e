"""The relay's connections to PostgreSQL cut or black-holed under load (relay -> proxy -> PostgreSQL).

The publisher and the counting use direct connections; only the relay goes
through the proxy, so the fault hits the relay alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time

import asyncpg
import pytest

from pgferry.db import Liveness
from pgferry.embedded import EmbeddedPostgres
from pgferry.receiver import Receiver
from pgferry.relay.process import RelaySettings
from tests.faults.conftest import Load, received_ids, settle
from tests.faults.proxy import FaultProxy
from tests.helpers import FAST, MakeReceiver, RunningRelay, eventually

#: Timeouts short enough for a test: a statement gets 2 s, a lock-holding session
#: that stops talking is ended by PostgreSQL after 3 s.
QUICK = dataclasses.replace(FAST, liveness=Liveness(command_timeout=2.0, session_timeout=3.0))


async def _delivered_after(receiver: Receiver, load: Load, mark: int, timeout: float) -> float:
    """Seconds until an event published after ``mark`` (an index into load.acked) is received."""
    started = time.monotonic()

    async def moved() -> bool:
        fresh = set(load.acked[mark:])
        return bool(fresh & set(received_ids([receiver])))

    await eventually(moved, timeout=timeout, what="deliveries of events published after the fault")
    return time.monotonic() - started


async def _relay_via_proxy(
    pg: EmbeddedPostgres, db_url: str, proxies: object, settings: RelaySettings
) -> tuple[FaultProxy, RunningRelay]:
    proxy: FaultProxy = await proxies(pg.port)  # type: ignore[operator]
    return proxy, RunningRelay(proxy.url_for(db_url), settings)


async def test_relay_db_connections_cut_repeatedly_lose_nothing(
    pg: EmbeddedPostgres, db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver, proxies: object
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1, retry_base_ms => 50, retry_max_ms => 500)", url)
    proxy, relay = await _relay_via_proxy(pg, db_url, proxies, QUICK)
    load = Load(db_url).start()
    recoveries = []
    try:
        await eventually(lambda: _received(receiver, 100), timeout=20, what="first deliveries")
        for i in range(4):
            proxy.cut(rst=i % 2 == 0)  # RST, then FIN, alternately
            recoveries.append(await _delivered_after(receiver, load, len(load.acked), timeout=20))
        await load.stop()
        tally = await settle(conn, [receiver], acked=load.acked, timeout=30)
    finally:
        await load.stop()
        await relay.stop()
    print(f"db link cut x4: {tally}, recovery {max(recoveries):.2f} s max, cut links {proxy.cuts}")
    assert tally.committed > 300 and not tally.lost and tally.dead == 0
    assert proxy.cuts >= 8  # each cut really ended the relay's connections


async def test_relay_db_connections_blackholed_recover_by_themselves(
    pg: EmbeddedPostgres, db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver, proxies: object
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1, retry_base_ms => 50, retry_max_ms => 500)", url)
    proxy, relay = await _relay_via_proxy(pg, db_url, proxies, QUICK)
    load = Load(db_url).start()
    try:
        await eventually(lambda: _received(receiver, 100), timeout=20, what="first deliveries")
        # Every connection of the relay goes silent mid-conversation; PostgreSQL still
        # sees its backends (and the locks they hold) alive: a network partition.
        proxy.blackhole()
        await asyncio.sleep(1.0)
        proxy.resume()
        resumed = time.monotonic()
        recovery = await _delivered_after(receiver, load, len(load.acked), timeout=40)
        await load.stop()
        tally = await settle(conn, [receiver], acked=load.acked, timeout=30)
        stop_started = time.monotonic()
    finally:
        await load.stop()
        await relay.stop()
    stopped_in = time.monotonic() - stop_started
    print(f"db link black-holed: {tally}, delivering again {recovery:.1f} s after the network healed "
          f"({time.monotonic() - resumed:.1f} s to settle), relay stopped in {stopped_in:.1f} s")  # fmt: skip
    assert tally.committed > 200 and not tally.lost and tally.dead == 0


async def test_relay_db_connections_stalled_briefly_carry_on(
    pg: EmbeddedPostgres, db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver, proxies: object
) -> None:
    receiver, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1)", url)
    proxy, relay = await _relay_via_proxy(pg, db_url, proxies, QUICK)
    load = Load(db_url).start()
    try:
        await eventually(lambda: _received(receiver, 100), timeout=20, what="first deliveries")
        accepted = proxy.accepted
        proxy.stall()  # shorter than the command timeout: a hiccup, not a failure
        await asyncio.sleep(1.0)
        proxy.resume()
        recovery = await _delivered_after(receiver, load, len(load.acked), timeout=20)
        await load.stop()
        tally = await settle(conn, [receiver], acked=load.acked, timeout=30)
    finally:
        await load.stop()
        await relay.stop()
    print(f"db link stalled 1 s: {tally}, delivering again {recovery:.2f} s after")
    assert tally.committed > 200 and not tally.lost and tally.duplicates == 0
    assert proxy.accepted == accepted  # rode it out on the same connections


async def _received(receiver: Receiver, n: int) -> bool:
    return len(receiver.received) >= n


async def test_healthy_relay_sessions_outlive_the_session_timeout(
    db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    """idle_session_timeout must only ever end silent sessions: a healthy, idle relay keeps
    its lock-holding sessions (and so its leadership and subscriptions) well past it."""
    _, url = await receiver_factory()
    await conn.execute("select ferry.subscribe('hook', array['s'], $1)", url)
    relay = RunningRelay(db_url, QUICK)
    query = (
        "select pid from pg_stat_activity where datname = current_database()"
        " and application_name in ('pgferry relay', 'pgferry ticker')"
    )
    try:

        async def both() -> bool:
            return len(await conn.fetch(query)) == 2

        await eventually(both, timeout=10, what="the relay's ownership and ticker sessions")
        before = {r["pid"] for r in await conn.fetch(query)}
        await asyncio.sleep(2.5 * QUICK.liveness.session_timeout)
        after = {r["pid"] for r in await conn.fetch(query)}
    finally:
        await relay.stop()
    assert before == after


def test_relay_settings_refuse_a_session_timeout_a_healthy_relay_would_hit() -> None:
    with pytest.raises(ValueError, match="claim_interval"):
        RelaySettings(liveness=Liveness(command_timeout=2, session_timeout=3))  # claim_interval 2 s
    with pytest.raises(ValueError, match="command_timeout"):
        dataclasses.replace(QUICK, liveness=Liveness(command_timeout=3, session_timeout=3))


def test_run_refuses_a_session_timeout_shorter_than_the_command_timeout(pgferry_cmd: list[str]) -> None:
    done = subprocess.run(
        [*pgferry_cmd, "run", "--db-session-timeout", "5", "--database-url", "postgresql://x@127.0.0.1:1/x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "session_timeout must exceed command_timeout" in done.stderr


async def test_relay_partitioned_from_postgres_hands_over_to_a_healthy_relay(
    pg: EmbeddedPostgres, db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver, proxies: object
) -> None:
    """Relay A reaches PostgreSQL through the proxy, relay B directly. A is cut off for good
    (black hole, never healed): its sessions go silent but stay open on the server. B must end
    up delivering A's subscriptions too, and nothing may be lost."""
    receivers: dict[str, Receiver] = {}
    for name in ("a", "b"):
        receivers[name], url = await receiver_factory()
        await conn.execute(
            "select ferry.subscribe($1, array['s'], $2, retry_base_ms => 50, retry_max_ms => 500)", name, url
        )
    proxy, partitioned = await _relay_via_proxy(pg, db_url, proxies, QUICK)
    healthy = RunningRelay(db_url, QUICK)
    load = Load(db_url).start()

    async def owners() -> list[set[str]]:
        rows = await conn.fetch("select owned from ferry.relays where heartbeat_at > now() - interval '1 second'")
        return [set(r["owned"]) for r in rows if r["owned"]]

    async def spread() -> bool:
        return sorted(map(len, await owners())) == [1, 1]

    async def healthy_owns_all() -> bool:
        return await owners() == [set(receivers)]

    try:
        await eventually(spread, timeout=20, what="one subscription per relay")
        proxy.blackhole()
        cut_at = time.monotonic()
        await eventually(healthy_owns_all, timeout=30, what="the healthy relay to own both subscriptions")
        took_over = time.monotonic() - cut_at
        await asyncio.sleep(0.5)
        await load.stop()
        tallies = {
            name: await settle(conn, [rec], acked=load.acked, subscription=name, timeout=30)
            for name, rec in receivers.items()
        }
    finally:
        await load.stop()
        await healthy.stop()
        await partitioned.stop()
    for name, tally in tallies.items():
        print(f"relay partitioned from PostgreSQL, subscription {name}: {tally}; "
              f"the healthy relay owned everything {took_over:.1f} s after the cut")  # fmt: skip
        assert tally.committed > 300 and not tally.lost and tally.dead == 0
    # PostgreSQL ended the silent sessions after session_timeout; the handover cannot be faster.
    assert QUICK.liveness.session_timeout <= took_over < 15
