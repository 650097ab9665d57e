"""Fixtures for the sender's conformance matrix: real servers on 127.0.0.1, each stopped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from pgferry.delivery.fasthttp import FastSender
from tests.delivery.conformance.scripted import MakeScripted, Script, ScriptedServer
from tests.delivery.conformance.servers import Aiohttp, Http10, Nginx, Node, Uvicorn


@pytest.fixture(scope="session")
def nginx() -> Iterator[Nginx]:
    if Nginx.binary is None:
        pytest.skip("nginx is not installed (PGFERRY_DEV=1 scripts/bootstrap.sh installs it with apt-get as root)")
    server = Nginx()
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    if Node.binary is None:
        pytest.skip("node is not installed (it comes with this machine's image)")
    server = Node()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def uvicorn_h11() -> Iterator[Uvicorn]:
    server = Uvicorn()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
async def aiohttp_web() -> AsyncIterator[Aiohttp]:
    server = Aiohttp()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(scope="session")
def http10() -> Iterator[Http10]:
    server = Http10()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def sender() -> AsyncIterator[FastSender]:
    sender = FastSender(pool_size=4)
    yield sender
    await sender.close()


@pytest.fixture
async def scripted() -> AsyncIterator[MakeScripted]:
    """``await scripted(script)``: a scripted server on 127.0.0.1, stopped after the test."""
    started: list[ScriptedServer] = []

    async def make(script: Script) -> ScriptedServer:
        server = await ScriptedServer(script).start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()
