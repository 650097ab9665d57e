"""The pipelined Redis connection against a real redis-server: every reply reaches the
command it answers, whatever else is in flight, times out, fails or breaks."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgferry.bench.brokers import RedisServer, redis_server_binary
from pgferry.delivery.redis_pipe import RedisConnectionLost, RedisError, RedisPipe

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason="redis-server is not installed")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
async def pipe(server: RedisServer) -> AsyncIterator[RedisPipe]:
    pipe = await RedisPipe.connect("127.0.0.1", server.port, 0, {})
    yield pipe
    pipe.close()


# One command of a random sequence: echo a value, a command Redis refuses, or an echo whose
# caller gives up before the reply (cancelled right after it was written).
commands = st.lists(
    st.one_of(
        st.tuples(st.just("echo"), st.binary(max_size=300)),
        st.tuples(st.just("error"), st.binary(max_size=20)),
        st.tuples(st.just("abandon"), st.binary(max_size=20)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=commands)
async def test_concurrent_commands_get_their_own_replies(pipe: RedisPipe, sequence: list[tuple[str, bytes]]) -> None:
    async def one(kind: str, value: bytes) -> None:
        if kind == "echo":
            assert await pipe.call("ECHO", value) == value
        elif kind == "error":
            with pytest.raises(RedisError, match="wrong number of arguments"):
                await pipe.call("ECHO", value, value)
        else:
            task = asyncio.ensure_future(pipe.call("ECHO", value))
            await asyncio.sleep(0)  # written, then given up on
            task.cancel()

    await asyncio.gather(*(one(kind, value) for kind, value in sequence))
    assert await pipe.call("ECHO", b"after") == b"after"  # nothing left over in the queue
    assert pipe.alive


async def test_a_caller_that_times_out_leaves_the_others_replies_in_order(server: RedisServer, pipe: RedisPipe) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await pipe.call("ECHO", "late")
        waiting = [asyncio.ensure_future(pipe.call("ECHO", f"v{i}")) for i in range(50)]
        await asyncio.sleep(0.1)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert await asyncio.gather(*waiting) == [f"v{i}".encode() for i in range(50)]


async def test_a_server_that_goes_away_fails_every_waiting_caller_and_the_connection(server: RedisServer) -> None:
    pipe = await RedisPipe.connect("127.0.0.1", server.port, 0, {})
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    waiting = [asyncio.ensure_future(pipe.call("ECHO", f"v{i}")) for i in range(20)]
    await asyncio.sleep(0.05)
    server.proc.kill()  # SIGKILL, stopped as it is: the commands written are never answered
    server.proc.wait()
    server.proc = None
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, RedisConnectionLost) for r in results), results
    assert not pipe.alive
    with pytest.raises(RedisConnectionLost):
        await pipe.call("PING")
    server.start()


async def test_login_and_database_are_checked_when_connecting(server: RedisServer) -> None:
    with pytest.raises(RedisError, match="DB index is out of range"):
        await RedisPipe.connect("127.0.0.1", server.port, 99, {})
    with pytest.raises(RedisError, match="AUTH"):  # no password is set on this server
        await RedisPipe.connect("127.0.0.1", server.port, 0, {"password": "nope"})
    pipe = await RedisPipe.connect("127.0.0.1", server.port, 2, {})
    try:
        await pipe.call("SET", "where", "two")
        assert await pipe.call("GET", "where") == b"two"
    finally:
        pipe.close()


def test_error_replies_are_told_apart_by_what_they_call_for() -> None:
    """A wrong password is a login failure (it was config), a server loading its data after a
    restart cannot serve yet (it was config too, retried thousands of times a second)."""
    kinds = {
        "WRONGPASS invalid username-password pair or user is disabled.": "auth",
        "NOAUTH Authentication required.": "auth",
        "ERR AUTH <password> called without any password configured for the default user.": "auth",
        "LOADING Redis is loading the dataset in memory": "unready",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.": "unready",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": "unready",
        "ERR DB index is out of range": "refused",
        "WRONGTYPE Operation against a key holding the wrong kind of value": "refused",
        "OOM command not allowed when used memory > 'maxmemory'.": "refused",
    }
    assert {text: RedisError(text).kind for text in kinds} == kinds
