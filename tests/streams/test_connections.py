"""Connections that send nothing are bounded in time and in number (``serving.py``): 650 of
them took a relay under ``ulimit -n 600`` to its limit, a webhook was not delivered and the
dashboard and metrics stopped answering (outside probe). Real sockets against a real relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

import pgferry
from pgferry.embedded import free_port
from pgferry.streams.api import SPARE_CONNECTIONS
from tests.helpers import MakeReceiver, StartApi, api_relay_process, eventually, received


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``seconds``; None if it stayed open."""
    sock.settimeout(0.1)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data
    return None


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


async def test_connections_without_a_request_head_are_closed_but_a_reader_is_not(start_api: StartApi) -> None:
    api = await start_api(allow_loopback=True, idle_timeout=0.5, heartbeat=0.2)
    with _sockets() as opened:
        silent = _connect(api.base)
        opened.append(silent)
        dribbling = _connect(api.base)
        opened.append(dribbling)
        dribbling.sendall(b"GET /v1/streams/x/events HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        kept_alive = _connect(api.base)
        opened.append(kept_alive)
        kept_alive.sendall(b"GET /v1/streams/x/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

        def dribble() -> bytes | None:  # a header byte every 0.1 s: never a whole head
            for _ in range(30):
                try:
                    dribbling.sendall(b"X")
                except OSError:
                    return b""
                if (got := _closed_within(dribbling, 0.1)) is not None:
                    return got
            return None

        assert await asyncio.to_thread(_closed_within, silent, 3) == b""
        assert await asyncio.to_thread(dribble) is not None, "a head dribbled a byte at a time kept its connection"
        answered = await asyncio.to_thread(_closed_within, kept_alive, 3)
        assert answered is not None and answered.startswith(b"HTTP/1.1 200"), answered  # answered, then closed

    # A reader being served keeps its connection through many idle timeouts.
    async with aiohttp.ClientSession() as session, session.get(f"{api.base}/v1/streams/live") as r:
        assert r.status == 200
        async with asyncio.timeout(5):
            await r.content.readuntil(b"retry: 2000\n\n")
        await asyncio.sleep(2.0)
        async with asyncio.timeout(2):
            assert await r.content.readuntil(b"\n\n") == b": heartbeat\n\n"


async def test_connections_beyond_the_cap_are_refused_with_503_and_a_log_line(
    start_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    api = await start_api(allow_loopback=True, max_clients=2)
    cap = 2 + SPARE_CONNECTIONS
    caplog.set_level(logging.WARNING, logger="pgferry.serving")
    with _sockets() as opened:
        for _ in range(cap):
            opened.append(_connect(api.base))
        await asyncio.sleep(0.3)
        one_more = _connect(api.base)
        opened.append(one_more)
        refused = await asyncio.to_thread(_closed_within, one_more, 3)
        assert refused is not None and refused.startswith(b"HTTP/1.1 503"), refused
        again = _connect(api.base)
        opened.append(again)
        assert await asyncio.to_thread(_closed_within, again, 3) is not None
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == 1, lines  # rate-limited: one line for both
        assert f"streams API: refused 1 connection(s): it holds {cap} at most" in lines[0]
        for s in opened[:10]:
            s.close()
        del opened[:10]
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as session, session.get(f"{api.base}/v1/streams/x/events") as r:
            assert r.status == 200  # room again


async def test_idle_connections_to_the_api_leave_delivery_dashboard_and_metrics_working(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, receiver_factory: MakeReceiver, tmp_path: Path
) -> None:
    """The outside probe's setup: a relay under an open files limit of 600 serving the API, the
    dashboard and metrics; 650 connections to the API that send nothing."""
    receiver, url = await receiver_factory()
    await ferry.subscribe("hook", ["fd"], url)
    dashboard, metrics = free_port(), free_port()
    log = tmp_path / "relay.log"
    async with api_relay_process(
        pgferry_cmd, db_url, log=log, wrapper=("prlimit", "--nofile=600:600"),
        args=("--dashboard-port", str(dashboard), "--metrics-port", str(metrics)),
    ) as (relay, base):  # fmt: skip
        await ferry.publish("fd", {"n": 0})
        await eventually(lambda: received(receiver, 1), timeout=15, what="the first event delivered")
        with _sockets() as opened:
            for _ in range(650):
                with contextlib.suppress(OSError):  # refused ones may be reset before the next
                    opened.append(_connect(base.removesuffix("/v1/streams")))
            await asyncio.sleep(1)
            fds = len(await asyncio.to_thread(os.listdir, f"/proc/{relay.pid}/fd"))
            assert fds < 560, f"the relay holds {fds} open files of 600"
            await ferry.publish("fd", {"n": 1})
            await eventually(lambda: received(receiver, 2), timeout=10, what="an event delivered meanwhile")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
                async with s.get(f"http://127.0.0.1:{dashboard}/") as r:
                    assert r.status == 200
                async with s.get(f"http://127.0.0.1:{metrics}/metrics") as r:
                    assert r.status == 200
    text = log.read_text()
    assert "Too many open files" not in text, text[-3000:]
    assert "streams API: refused" in text
