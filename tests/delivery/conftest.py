"""Fixtures for delivery tests: an in-process relay and receivers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pgferry.log.ticker import TickerSettings
from pgferry.relay.ownership import OwnershipSettings
from pgferry.relay.process import Relay, RelaySettings

FAST = RelaySettings(
    ticker=TickerSettings(busy_interval=0.005, idle_interval=0.05, maintain_every=0.5),
    ownership=OwnershipSettings(claim_interval=0.2, stop_grace=2.0),
    leader_retry_interval=0.2,
)


class RunningRelay:
    def __init__(self, url: str, settings: RelaySettings = FAST) -> None:
        self.relay = Relay(url, settings)
        self.stop_event = asyncio.Event()
        self.task = asyncio.create_task(self.relay.run(self.stop_event))

    async def stop(self) -> None:
        self.stop_event.set()
        await asyncio.wait_for(self.task, 30)


@pytest.fixture
async def relay(db_url: str) -> AsyncIterator[RunningRelay]:
    running = RunningRelay(db_url)
    yield running
    await running.stop()
