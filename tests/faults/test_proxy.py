"""The fault proxy itself does what the fault tests rely on (a proxy that silently passed
everything would make every network-fault test pass for the wrong reason)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pgferry.delivery.fasthttp import FastSender
from tests.faults.conftest import port_of
from tests.faults.proxy import FaultProxy
from tests.helpers import MakeReceiver


async def _post(sender: FastSender, url: str, timeout: float = 1.0) -> str | None:
    result = await sender.send(url, b"{}", {"webhook-id": "x"}, timeout=timeout, connect_timeout=timeout)
    return result.error_class


async def test_proxy_passes_cuts_blackholes_stalls_and_resumes(receiver_factory: MakeReceiver) -> None:
    receiver, url = await receiver_factory()
    proxy = FaultProxy(port_of(url))
    await proxy.start()
    sender = FastSender(pool_size=4)
    via = proxy.url_for(url)
    try:
        assert await _post(sender, via) is None
        assert proxy.open_links == 1  # kept alive

        assert proxy.cut(rst=True) == 1
        await asyncio.sleep(0.05)
        # The kept-alive connection is gone; the sender reconnects through the proxy.
        assert await _post(sender, via) is None
        assert proxy.accepted == 2

        proxy.blackhole()
        started = time.monotonic()
        assert await _post(sender, via, timeout=0.5) == "timeout"
        # not before its timeout, give or take the loop's clock (uvloop reads it once per
        # iteration, in whole milliseconds: a CI run measured 0.49988 s)
        assert time.monotonic() - started >= 0.49
        before = receiver.stats.requests
        assert await _post(sender, via, timeout=0.3) == "timeout"  # new connections too
        assert receiver.stats.requests == before

        proxy.resume()
        assert await _post(sender, via) is None

        proxy.stall()
        pending = asyncio.create_task(_post(sender, via, timeout=5))
        await asyncio.sleep(0.3)
        assert not pending.done()
        proxy.resume()
        assert await pending is None  # held, then delivered
    finally:
        await sender.close()
        await proxy.stop()


@pytest.mark.parametrize("rst", [True, False])
async def test_proxy_cut_ends_a_request_in_flight(receiver_factory: MakeReceiver, rst: bool) -> None:
    from pgferry.receiver import Hang

    _, url = await receiver_factory(lambda _: Hang())
    proxy = FaultProxy(port_of(url))
    await proxy.start()
    sender = FastSender(pool_size=4)
    try:
        pending = asyncio.create_task(_post(sender, proxy.url_for(url), timeout=5))
        await asyncio.sleep(0.2)
        proxy.cut(rst=rst)
        assert await asyncio.wait_for(pending, 2) in ("reset", "empty_reply")
    finally:
        await sender.close()
        await proxy.stop()
