"""History for the API's readers in bounded memory and connections: long-polls that page through a
big transaction and resume inside it, clients catching up on big transactions at once, and the
relay's memory while four of them read one of 100 MB."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import asyncpg
import orjson

import pgferry
from pgferry.bench.procstat import memory_mb
from tests.helpers import StartApi, api_relay_process, tick


async def poll(session: aiohttp.ClientSession, url: str, **params: Any) -> tuple[dict[str, Any], int]:
    """One long-poll's answer and its size in bytes."""
    async with session.get(url, params={k: str(v) for k, v in params.items()}) as response:
        body = await response.read()
        assert response.status == 200, body[:300]
        return orjson.loads(body), len(body)


async def test_a_long_poll_reads_a_big_transaction_a_page_at_a_time_and_resumes_inside_it(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """A page ending inside a tick resumes after its last event; an answer stops near 4 MB
    whatever ``limit`` says (a giant tick was loaded whole, and answered up to limit)."""
    noise = await ferry.publish("noise", 0)
    small = await ferry.publish_many([{"stream": "tx" if n % 5 else "noise", "payload": n} for n in range(3000)])
    await tick(conn)
    large = await ferry.publish_many([{"stream": "tx", "payload": "z" * 40_000} for _ in range(300)])  # 12 MB
    await ferry.close_stream("tx")
    await tick(conn)
    assert noise < small[0]
    api = await start_api(allow_loopback=True)
    url = f"{api.base}/v1/streams/tx/events"
    expected = [i for n, i in enumerate(small) if n % 5] + large
    got: list[int] = []
    sizes: list[tuple[int, int]] = []
    after: str | None = None
    async with aiohttp.ClientSession() as session:
        while True:
            body, size = await poll(session, url, limit=1000, **({"after": after} if after else {}))
            got += [e["id"] for e in body["events"]]
            sizes.append((len(body["events"]), size))
            assert body["next"], body
            after = body["next"]
            if body["closed"]:
                break
    assert got == expected  # every one, once, in order, across pages that end inside a tick
    assert [n for n, _ in sizes[:2]] == [1000, 1000]  # the first transaction has 2,400 of them
    assert all(size < (4 << 20) + 50_000 for _, size in sizes), sizes  # about 4 MB at most
    assert len(sizes) >= 5  # (12 MB in the second transaction)


async def test_clients_catching_up_on_big_transactions_at_once_share_a_few_connections(
    start_api: StartApi, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """Each big tick was read on a connection opened for it: four clients catching up on three
    such ticks opened twelve, four at once, and any number of clients could use up the server's
    connections. Now they take turns on ``history_connections`` of them, kept open."""
    ids: list[int] = []
    for _ in range(3):  # three transactions of 6 MB: each too big to be read whole
        ids += await ferry.publish_many([{"stream": "bulk", "payload": "b" * 20_000} for _ in range(300)])
        await tick(conn)
    await ferry.close_stream("bulk")
    await tick(conn)
    api = await start_api(allow_loopback=True, history_connections=2)
    held: set[int] = set()
    most = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        while not done.is_set():  # the backends reading a tick a page at a time, but the API's pool's
            pids = await conn.fetch(
                "select pid from pg_stat_activity where datname = current_database() and state <> 'idle'"
                " and query like '%batch_events%order by id%' and application_name <> 'pgferry streams api'"
                " and pid <> pg_backend_pid()"
            )
            held.update(r["pid"] for r in pids)
            most = max(most, len(pids))
            await asyncio.sleep(0.005)

    async def catch_up(session: aiohttp.ClientSession) -> list[int]:
        seen: list[int] = []
        async with session.get(f"{api.base}/v1/streams/bulk") as response:
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *frames, buffer = buffer.split(b"\n\n")
                seen += [orjson.loads(f.split(b"\n", 1)[0][6:])["id"] for f in frames if f.startswith(b'data: {"')]
        return seen

    watching = asyncio.create_task(watch())
    try:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.wait_for(asyncio.gather(*(catch_up(session) for _ in range(4))), 60)
    finally:
        done.set()
        await watching
    assert all(r == ids for r in results)
    assert held and most <= 2 and len(held) <= 2, (most, held)


def reset_peak(pid: int) -> None:
    """The process's peak resident memory (VmHWM) starts again from now."""
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")


async def test_four_clients_catching_up_on_one_100_mb_transaction_keep_the_relays_memory_bounded(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    """2,000 events of 50 KB in one transaction: read whole by each client, they took the relay
    from 58 MB to 877 MB (outside probe). Small events come first, so that the readers expect
    small ones. The relay is a process of its own, measured from /proc."""
    ids = await ferry.publish_many([{"stream": "huge", "payload": n} for n in range(50)])
    await tick(conn)
    ids += await ferry.publish_many([{"stream": "huge", "payload": "h" * 50_000} for _ in range(2000)])
    await ferry.close_stream("huge")
    await tick(conn)
    async with api_relay_process(pgferry_cmd, db_url) as (relay, api), aiohttp.ClientSession() as session:
        before = memory_mb(relay.pid)["VmRSS"]
        reset_peak(relay.pid)

        async def catch_up() -> int:
            frames, carry = 0, b""
            async with session.get(f"{api}/huge") as response:
                async for chunk in response.content.iter_any():  # counted, not kept
                    data = carry + chunk
                    frames += data.count(b"\nid: ")
                    carry = data[-4:]  # (a line split between two chunks)
            return frames

        counts = await asyncio.wait_for(asyncio.gather(*(catch_up() for _ in range(4))), 120)
        peak = memory_mb(relay.pid)["VmHWM"]
    assert counts == [len(ids) + 1] * 4  # every event and the end, to each
    grown = peak - before
    assert grown < 100, f"the relay grew {grown:.0f} MB reading 4 x 100 MB ({before:.0f} MB before)"
    print(f"relay memory: {before:.0f} MB, peak {peak:.0f} MB", file=sys.stderr)
