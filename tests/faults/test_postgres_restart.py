"""PostgreSQL restarted (fast, immediate = crash) and down for a while, as writers publish and the relay delivers.

tests/delivery/test_relay_faults.py restarts an idle-ish server once per mode
between publishes; here the writers keep publishing through the restarts,
requests are in flight when the server goes away, and the count includes
commits whose acknowledgement the crash swallowed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.receiver import Receiver, Slow
from pgferry.schema import install
from tests.faults.conftest import Load, port_of, received_ids, settle
from tests.faults.proxy import FaultProxy
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually


async def test_postgres_restarts_and_outage_under_load(receiver_factory: MakeReceiver) -> None:
    server = EmbeddedPostgres(settings={"fsync": "on"})  # a crash must not lose acknowledged commits
    server.start()
    relay: RunningRelay | None = None
    load: Load | None = None
    try:
        conn = await db.connect(server.url)
        await install(conn)
        receiver, url = await receiver_factory(lambda _: Slow(0.02))  # requests in flight at the restart
        await conn.execute(
            "select ferry.subscribe('hook', array['s'], $1, retry_base_ms => 50, retry_max_ms => 500)", url
        )
        await conn.close()
        relay = RunningRelay(server.url)
        load = Load(server.url).start()
        recoveries: dict[str, float] = {}
        for mode in ("fast", "immediate", "fast", "immediate", "down 5 s"):
            target = len(receiver.received) + 100
            await eventually(lambda: _received(receiver, target), timeout=30, what="deliveries")  # noqa: B023
            if mode == "down 5 s":  # long enough for the relay's reconnect backoff to grow
                await asyncio.to_thread(server.stop, "immediate")
                await asyncio.sleep(5)
                await asyncio.to_thread(server.start)
            else:
                await asyncio.to_thread(server.restart, mode)
            back = time.monotonic()
            mark = len(load.acked)

            async def fresh_delivered(mark: int = mark) -> bool:
                return bool(set(load.acked[mark:]) & set(received_ids([receiver])))

            await eventually(fresh_delivered, timeout=30, what=f"deliveries after the {mode} restart")
            recoveries[mode] = max(recoveries.get(mode, 0.0), time.monotonic() - back)
        await load.stop()
        conn = await db.connect(server.url)
        try:
            tally = await settle(conn, [receiver], acked=load.acked, timeout=60)
        finally:
            await conn.close()
        tally.notes["publish rounds failed"] = load.failed_rounds
    finally:
        try:  # the server goes away whatever the load or the relay raise on the way out
            if load is not None:
                await load.stop()
            if relay is not None:
                await relay.stop()
        finally:
            server.destroy()
    back_in = ", ".join(f"{m} {s:.1f} s" for m, s in recoveries.items())
    print(f"PostgreSQL restarted fast, immediate, fast, immediate, then down 5 s, under load: {tally}; "
          f"delivering again {back_in} after the server was back")  # fmt: skip
    assert tally.committed > 400 and not tally.lost and tally.dead == 0
    assert load.failed_rounds > 0  # the writers really were cut off by the restarts
    assert recoveries["down 5 s"] < 4  # the reconnect backoff stays short (it was 6.2 s with a 10 s cap)


async def _received(receiver: Receiver, n: int) -> bool:
    return len(receiver.received) >= n


async def test_a_relay_started_while_postgres_starts_up_waits_for_it(
    pgferry_cmd: list[str], db_url: str, proxies: Callable[[int], Awaitable[FaultProxy]]
) -> None:
    """A relay started with its database (after a crash, a restart) met FATAL 57P03 and exited at
    once, with a hint to check its URL (outside probe)."""
    proxy = await proxies(port_of(db_url))
    proxy.starting()
    run = asyncio.create_task(cli(pgferry_cmd, proxy.url_for(db_url), "run", "--exit-after", "4"))
    await asyncio.sleep(2)
    assert not run.done(), (await run).stderr
    proxy.resume()
    done = await run
    assert done.returncode == 0, done.stderr
    assert "not accepting connections yet" in done.stderr and "connected to" in done.stderr
