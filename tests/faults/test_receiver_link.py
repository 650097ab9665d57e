"""The relay's connections to the receiver cut and black-holed mid-request (relay -> proxy -> receiver)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from pgferry.receiver import Receiver
from tests.faults.conftest import Load, port_of, received_ids, settle
from tests.faults.proxy import FaultProxy
from tests.helpers import MakeReceiver, RunningRelay, eventually

Proxies = Callable[[int], Awaitable[FaultProxy]]


async def _delivered_after(receiver: Receiver, load: Load, mark: int, timeout: float) -> float:
    started = time.monotonic()

    async def moved() -> bool:
        return bool(set(load.acked[mark:]) & set(received_ids([receiver])))

    await eventually(moved, timeout=timeout, what="deliveries of events published after the fault")
    return time.monotonic() - started


async def test_receiver_link_cut_and_blackholed_mid_request(
    db_url: str, conn: asyncpg.Connection, receiver_factory: MakeReceiver, proxies: Proxies
) -> None:
    receiver, url = await receiver_factory()
    proxy = await proxies(port_of(url))
    await conn.execute(
        "select ferry.subscribe('hook', array['s'], $1, timeout_ms => 1000, connect_timeout_ms => 500,"
        " retry_base_ms => 50, retry_max_ms => 500, max_in_flight => 16)",
        proxy.url_for(url),
    )
    relay = RunningRelay(db_url)
    load = Load(db_url).start()
    recoveries: dict[str, float] = {}
    try:
        await eventually(lambda: _received(receiver, 100), timeout=20, what="first deliveries")
        for i in range(3):
            proxy.cut(rst=i != 1)
            recoveries[f"cut {i + 1}"] = await _delivered_after(receiver, load, len(load.acked), timeout=20)
        # Mid-request silence: requests already sent get no answer, new connections get nowhere.
        proxy.blackhole()
        await asyncio.sleep(2.0)
        stuck = proxy.open_links
        proxy.resume()
        recoveries["black hole"] = await _delivered_after(receiver, load, len(load.acked), timeout=20)
        await load.stop()
        tally = await settle(conn, [receiver], acked=load.acked, timeout=30)
        timeouts = await conn.fetchval("select count(*) from ferry.attempt_history() where error_class = 'timeout'")
    finally:
        await load.stop()
        await relay.stop()
    print(f"receiver link cut x3 + black hole 2 s: {tally}, timeouts {timeouts}, black-holed links {stuck}, "
          f"recovery " + ", ".join(f"{k} {v:.2f} s" for k, v in recoveries.items()))  # fmt: skip
    assert tally.committed > 500 and not tally.lost and tally.dead == 0
    assert timeouts > 0 and stuck > 0  # requests really were left hanging, and timed out
    assert max(recoveries.values()) < 5


async def _received(receiver: Receiver, n: int) -> bool:
    return len(receiver.received) >= n
