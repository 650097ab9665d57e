"""WAL capture running in the background of a test, as the relay runs it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from pgferry import db
from pgferry.capture.wal import WalCapture, WalSettings
from tests.helpers import eventually


class Running:
    """WAL capture as the relay runs it (capture/wal.py), in the background of a test."""

    def __init__(
        self, url: str, capture: type[WalCapture] = WalCapture, *, as_relay: bool = False,
        settings: WalSettings | None = None, command_timeout: float | None = None,
    ) -> None:  # fmt: skip
        self.url = url
        self.kind = capture
        self.stop = asyncio.Event()
        #: the session as the relay opens it (search_path pg_catalog, pg_temp; relay/leader.py)
        self.as_relay = as_relay
        self.settings = settings or WalSettings(chunk=3, recheck_interval=0.2)
        self.command_timeout = command_timeout

    async def __aenter__(self) -> Running:
        await self._connect()
        self.task = asyncio.create_task(self._run())
        return self

    async def _connect(self) -> None:
        if self.as_relay:
            kwargs = db.Liveness().connect_kwargs("pgferry wal capture", holds_locks=True)
            if self.command_timeout is not None:
                kwargs["command_timeout"] = self.command_timeout
            self.conn = await db.connect(self.url, **kwargs)
        else:
            self.conn = await db.connect(self.url)
        self.capture = self.kind(self.conn, self.url, self.settings)

    async def _run(self) -> None:
        """As the relay's leader runs it: a lost connection is made again and capture goes on (a
        statement that outlived a 0.2 s command_timeout on a loaded machine once left asyncpg's
        connection closed, and the test's capture ended there; relay/leader.py reconnects)."""
        while True:
            try:
                await self.capture.run(self.stop)
                return
            except db.CONNECTION_ERRORS:
                if self.stop.is_set():
                    return
                self.conn.terminate()
                await self._connect()

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)
        await self.conn.close()

    async def caught_up(self, conn: asyncpg.Connection, timeout: float = 15) -> None:
        """Until the slot is confirmed past everything written so far."""
        target = await conn.fetchval("select pg_current_wal_flush_lsn()::text")

        async def past() -> bool:
            if self.task.done():
                self.task.result()  # its error, if it ended with one
            return bool(await conn.fetchval(
                "select s.confirmed_flush_lsn >= $1::text::pg_lsn from pg_replication_slots s "
                "join ferry.wal_slot w using (slot_name)", target))  # fmt: skip

        await eventually(past, timeout=timeout, what="WAL capture caught up")


@pytest.fixture
async def wal(db_url: str) -> AsyncIterator[Running]:
    """Chunks of 3 changes, so that the tests' transactions take several."""
    async with Running(db_url) as running:
        yield running
