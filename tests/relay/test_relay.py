"""`pgferry run` as a real process: one ticker among several relays, failover, shutdown, errors."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator

import aiohttp
import asyncpg
import orjson
import pytest

import pgferry
from pgferry.receiver import Received, Slow
from tests.helpers import MakeReceiver, RelayProcess, RunningRelay, eventually, received_ids


@pytest.fixture
def relays(pgferry_cmd: list[str], db_url: str) -> Iterator[list[RelayProcess]]:
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        relay.stop()


async def ticker_holders(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "select count(*) from pg_locks where locktype = 'advisory' and classid = 28774 and objid = 2 and granted"
    )


async def test_one_ticker_among_relays_and_failover_after_sigkill(
    pgferry_cmd: list[str], db_url: str, relays: list[RelayProcess], conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    relays += [RelayProcess(pgferry_cmd, db_url), RelayProcess(pgferry_cmd, db_url)]

    async def one_leader() -> bool:
        return sum(r.logged("ticker: this relay is now the leader") for r in relays) == 1

    await eventually(one_leader, timeout=20, what="a ticker to be elected")
    await eventually(lambda: _logged_any(relays, "standing by"), timeout=10, what="the other relay to stand by")
    assert await ticker_holders(conn) == 1
    leader = next(r for r in relays if r.logged("now the leader"))
    standby = next(r for r in relays if r is not leader)

    await ferry.register_consumer("c")
    received: list[int] = []

    async def read() -> None:
        async for batch in ferry.read("c", poll_interval=0.2):
            received.extend(e.id for e in batch)
            await batch.ack()

    reader = asyncio.create_task(read())
    try:
        before = await ferry.publish("s", {"n": 1})
        await eventually(_contains(received, before), what="delivery through the first ticker")

        leader.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await eventually(_logged(standby, "now the leader"), timeout=10, what="the standby to take over")
        takeover = time.monotonic() - killed_at
        assert takeover < 5, f"took {takeover:.1f} s"
        after = await ferry.publish("s", {"n": 2})
        await eventually(_contains(received, after), what="delivery through the new ticker")
        assert await ticker_holders(conn) == 1
    finally:
        reader.cancel()


def _logged(relay: RelayProcess, text: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return relay.logged(text)

    return check


async def _logged_any(relays: list[RelayProcess], text: str) -> bool:
    return any(r.logged(text) for r in relays)


def _contains(items: list[int], item: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return item in items

    return check


async def test_sigterm_shuts_down_cleanly(pgferry_cmd: list[str], db_url: str, relays: list[RelayProcess]) -> None:
    relay = RelayProcess(pgferry_cmd, db_url)
    relays.append(relay)
    await eventually(_logged(relay, "now the leader"), timeout=20, what="the relay to start")
    relay.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(relay.proc.wait, 10)
    assert code == 0
    assert relay.logged("SIGTERM received") and relay.logged("relay stopped")


def _run_cli(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, check=False)


async def test_run_explains_unreachable_database_and_missing_schema(pgferry_cmd: list[str], empty_db_url: str) -> None:
    bad = await asyncio.to_thread(_run_cli, pgferry_cmd, "run", "--database-url", "postgresql://me:pw@127.0.0.1:1/x")
    assert bad.returncode == 1
    assert "cannot connect to PostgreSQL at postgresql://me:***@127.0.0.1:1/x" in bad.stderr
    assert "pw@" not in bad.stderr

    bad = await asyncio.to_thread(_run_cli, pgferry_cmd, "run", "--database-url", "not a url")
    assert bad.returncode == 1 and "not a PostgreSQL URL" in bad.stderr

    missing = await asyncio.to_thread(_run_cli, pgferry_cmd, "run", "--database-url", empty_db_url)
    assert missing.returncode == 1 and "pgferry install" in missing.stderr

    first = await asyncio.to_thread(_run_cli, pgferry_cmd, "install", "--database-url", empty_db_url)
    assert first.returncode == 0 and "installed: 0001_event_log" in first.stdout
    again = await asyncio.to_thread(_run_cli, pgferry_cmd, "install", "--database-url", empty_db_url)
    assert again.returncode == 0 and "no migration to apply" in again.stdout


async def test_run_without_url_starts_a_throwaway_postgres_and_demo(pgferry_cmd: list[str]) -> None:
    # Stopped with SIGTERM once checked: with --exit-after 10 a loaded CI machine once ended the
    # demo before it served its page (2.4 s on a quiet one).
    proc = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "run", "--exit-after", "90", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    async with asyncio.timeout(60):
        while not any("to watch the answers stream in" in line for line in lines):
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise AssertionError(f"the demo ended before serving its page: {(await proc.stderr.read()).decode()}")
            lines.append(line)
    page = lines[-1].split("open ")[1].split()[0]
    stream = lines[-1].split("curl -N ")[1].strip()
    async with aiohttp.ClientSession() as session:
        async with session.get(page) as r:
            assert r.status == 200 and "new EventSource" in await r.text()
        # The answers the page follows, over SSE, with the page's origin allowed by CORS.
        async with session.get(stream, headers={"Origin": page.rstrip("/")}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == page.rstrip("/")
            await r.content.readuntil(b"\n\n")  # retry:
            event = (await r.content.readuntil(b"\n\n")).decode()
            data = orjson.loads(next(line[6:] for line in event.splitlines() if line.startswith("data: ")))
            assert data["payload"]["question"] == "What does pgferry do?", event
    wanted = ("demo: backfill 1: done", "stream=public.demo_payments", "received:")
    async with asyncio.timeout(60):  # what the demo shows, before it is stopped
        while not all(any(w in line for line in lines) for w in wanted):
            line = (await proc.stdout.readline()).decode()
            if not line:
                break
            lines.append(line)
    proc.terminate()
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    stdout = "".join(lines) + out.decode()
    assert "throwaway PostgreSQL" in stdout
    assert "demo: backfill 1: done, 100,000 rows" in stdout  # the orders there before capture, as READ events
    assert "read event" in stdout and "public.demo_orders" in stdout and "demo.greetings" in stdout
    assert "captured from the write-ahead log" in stdout and "stream=public.demo_payments" in stdout
    assert "webhook evt_" in stdout and "received:" in stdout


async def test_an_idle_relay_s_heartbeat_row_does_not_grow_with_its_subscriptions(
    conn: asyncpg.Connection, ferry: pgferry.Ferry, relay: RunningRelay
) -> None:
    """Every round rewrote each counter of each subscription, zeros included: ~300 KB of JSON every
    2 s with 3,000 idle subscriptions (outside probe). Zeros are left out; status counts them 0."""
    for n in range(200):
        await ferry.subscribe(f"idle-{n}", ["quiet"], "http://127.0.0.1:9/")

    async def all_owned() -> bool:
        return bool(await conn.fetchval("select cardinality(owned) = 200 from ferry.relays"))

    await eventually(all_owned, what="the relay delivering all 200")
    assert await conn.fetchval("select octet_length(stats::text) from ferry.relays") < 200
    rows = await conn.fetch("select delivered_1m, in_flight from ferry.subscription_status()")
    assert {(r["delivered_1m"], r["in_flight"]) for r in rows} == {(0, 0)}


async def test_a_heartbeat_without_the_owned_list_keeps_the_one_written(conn: asyncpg.Connection) -> None:
    """The relay leaves its owned list out of a round when it did not change (rewritten every 2 s,
    4,800 units were most of an idle relay's WAL; outside probe)."""
    await conn.fetch("select * from ferry.relay_round('r1', 'h', 1, array['a', 'b#0/2'], '{}')")
    await conn.fetch("select * from ferry.relay_round('r1', 'h', 1, null, '{}')")
    assert await conn.fetchval("select owned from ferry.relays where id = 'r1'") == ["a", "b#0/2"]
    await conn.fetch("select * from ferry.relay_round('r2', 'h', 2, null, '{}')")  # a row removed meanwhile
    assert await conn.fetchval("select owned from ferry.relays where id = 'r2'") == []


async def test_a_stopping_relay_starts_no_new_request_and_records_what_it_delivered(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """A stopping worker went on sending its whole batch (100 requests at max_in_flight 2 here),
    was cancelled when its grace ran out, and the next owner sent again everything it had
    delivered: 176 of 437 events twice after one SIGTERM (outside probe). Now the requests in
    flight finish, the rest are parked, and the stop is quick."""

    def slow(_: Received) -> Slow:
        return Slow(0.1)

    receiver, url = await receiver_factory(slow)
    await ferry.subscribe("s", ["s"], url, max_in_flight=2)
    await conn.execute("select ferry.publish('s', jsonb_build_object('n', g)) from generate_series(1, 100) g")
    relay = RunningRelay(db_url)
    await eventually(lambda: len(receiver.received) >= 10, what="deliveries under way")
    started = time.monotonic()
    await relay.stop()
    assert time.monotonic() - started < 1.5  # the requests in flight, not the batch (FAST's grace: 2 s)
    relay = RunningRelay(db_url)
    try:
        await eventually(lambda: len(set(received_ids(receiver))) == 100, timeout=60, what="every event")
    finally:
        await relay.stop()
    ids = received_ids(receiver)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} event(s) delivered twice"


async def test_a_relay_s_row_removed_by_hand_gets_its_owned_list_back_within_a_few_rounds(
    conn: asyncpg.Connection, ferry: pgferry.Ferry, relay: RunningRelay
) -> None:
    """The owned list goes out only when it changes (or every few rounds): a row removed (by hand,
    or pruned after an hour's silence) came back with no subscriptions for 60 s (outside probe)."""
    await ferry.subscribe("q1", ["q"], "http://127.0.0.1:9/")

    async def owned() -> bool:
        return bool(await conn.fetchval("select owned = array['q1'] from ferry.relays"))

    await eventually(owned, what="the relay delivering q1")
    await conn.execute("delete from ferry.relays")
    await eventually(owned, timeout=3, what="its owned list written again")  # FAST: 5 rounds are 1 s
