"""Test fixtures: one real PostgreSQL cluster per session, a fresh database per test."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
import uvloop

import pgferry
from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.receiver import Behaviour, Receiver, always_ok
from pgferry.schema import install
from tests.helpers import RunningRelay

TEMPLATE = "pgferry_template"
_counter = itertools.count()

# `pgferry run` runs one relay process per usable core by default. The suite's relays are one
# process each: tests SIGKILL a relay's pid, count relays and read their log as one process's, and
# the machine running them is shared. Tests of the supervisor pass --processes themselves.
os.environ["PGFERRY_PROCESSES"] = "1"


#: Tests whose assertions hold a clock (rates, seconds to recover, queries per second) or that load
#: the machine on purpose: scripts/test runs them one at a time after the rest, which run on two
#: workers (pytest-xdist). A test of timing beside another test's load reads the load, not pgferry.
ALONE = (
    "tests/bench/",
    "tests/faults/",
    "tests/delivery/test_endpoint_health.py",
    "tests/delivery/test_idle_subscriptions.py",
    "tests/delivery/test_many_subscriptions.py",
    "tests/delivery/test_slow_requests.py",
    "tests/log/test_retention_limits.py",
    "tests/relay/test_fencing.py",
    "tests/relay/test_supervisor.py",
    "tests/tokens/test_token_store.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that run alone (see ALONE)."""
    for item in items:
        if item.nodeid.startswith(ALONE):
            item.add_marker(pytest.mark.alone)


def pytest_asyncio_loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run the tests on uvloop, like `pgferry run` does."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    # fsync off: the tests are about ordering and loss across processes, not disk durability.
    server = EmbeddedPostgres(settings={"fsync": "off", "full_page_writes": "off"})
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def url_for(pg: EmbeddedPostgres, database: str) -> str:
    return pg.url.rsplit("/", 1)[0] + "/" + database


@pytest.fixture(scope="session")
async def template_db(pg: EmbeddedPostgres) -> str:
    admin = await asyncpg.connect(pg.url)
    try:
        await admin.execute(f"create database {TEMPLATE}")
    finally:
        await admin.close()
    conn = await db.connect(url_for(pg, TEMPLATE))
    try:
        await install(conn)
    finally:
        await conn.close()
    return TEMPLATE


async def _create_db(pg: EmbeddedPostgres, template: str) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    admin = await asyncpg.connect(pg.url)
    try:
        await admin.execute(f"create database {name} template {template}")
    finally:
        await admin.close()
    return name


async def _drop_db(pg: EmbeddedPostgres, name: str) -> None:
    admin = await asyncpg.connect(pg.url)
    try:
        for attempt in range(50):
            try:
                await admin.execute(f"drop database if exists {name} with (force)")
                return
            except asyncpg.ObjectInUseError:
                # A WAL capture slot still being read (by a relay a test just killed, say): FORCE
                # ends sessions but not an active slot's reader, and inactive slots go with the database.
                if attempt == 49:
                    raise
                await admin.execute(
                    "select pg_terminate_backend(active_pid) from pg_replication_slots "
                    "where database = $1 and active_pid is not null",
                    name,
                )
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


@pytest.fixture
async def db_url(pg: EmbeddedPostgres, template_db: str) -> AsyncIterator[str]:
    """A new database with the ferry schema installed."""
    name = await _create_db(pg, template_db)
    yield url_for(pg, name)
    await _drop_db(pg, name)


@pytest.fixture
async def second_db_url(pg: EmbeddedPostgres, template_db: str) -> AsyncIterator[str]:
    """Another database with the ferry schema, made from the same template as ``db_url``'s."""
    name = await _create_db(pg, template_db)
    yield url_for(pg, name)
    await _drop_db(pg, name)


@pytest.fixture
async def empty_db_url(pg: EmbeddedPostgres) -> AsyncIterator[str]:
    """A new database without the ferry schema."""
    name = await _create_db(pg, "template1")
    yield url_for(pg, name)
    await _drop_db(pg, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await db.connect(db_url)
    yield connection
    await connection.close()


@pytest.fixture
async def ferry(db_url: str) -> AsyncIterator[pgferry.Ferry]:
    async with pgferry.connect(db_url) as handle:
        yield handle


@pytest.fixture
def pgferry_cmd() -> list[str]:
    """How to run the installed `pgferry` command in a subprocess."""
    exe = Path(sys.executable).with_name("pgferry")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pgferry"]


@pytest.fixture
async def relay(db_url: str) -> AsyncIterator[RunningRelay]:
    """A relay running in the test's event loop on ``db_url`` (FAST settings)."""
    running = RunningRelay(db_url)
    yield running
    await running.stop()


@pytest.fixture
async def receiver_factory() -> AsyncIterator[Callable[[Behaviour], Awaitable[tuple[Receiver, str]]]]:
    """Start test receivers on 127.0.0.1 (``make(behaviour)`` -> receiver, URL); all stopped afterwards."""
    started: list[Receiver] = []

    async def make(behaviour: Behaviour = always_ok) -> tuple[Receiver, str]:
        receiver = Receiver(behaviour)
        url = await receiver.start()
        started.append(receiver)
        return receiver, url

    yield make
    for receiver in started:
        await receiver.stop()
