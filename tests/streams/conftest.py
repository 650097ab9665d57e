"""A relay serving the streams HTTP API, in process, with the delivery tests' fast settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from pgferry.streams.settings import ApiSettings
from tests.helpers import FAST, ApiRelay, StartApi


@pytest.fixture
async def start_api(db_url: str) -> AsyncIterator[StartApi]:
    """``await start_api(allow_loopback=True, ...)``: a relay (not delivering) serving the API with
    those ``ApiSettings`` (and Prometheus metrics with ``metrics=True``); stopped after the test."""
    running: list[ApiRelay] = []

    async def start(*, metrics: bool = False, **api: object) -> ApiRelay:
        settings = replace(FAST, deliver=False, api=ApiSettings(**api), metrics_port=0 if metrics else None)  # type: ignore[arg-type]
        relay = ApiRelay(db_url, settings)
        running.append(relay)
        await relay.started()
        return relay

    yield start
    for relay in running:
        if not relay.task.done():
            await relay.stop()
