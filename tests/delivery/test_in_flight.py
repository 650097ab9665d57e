"""Each subscription's fair share of the relay's requests in flight (delivery/in_flight.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import asyncpg
import orjson

import pgferry
from pgferry.delivery.in_flight import MIN_SHARE, RelayInFlight, SubscriptionInFlight
from pgferry.receiver import Received, Slow
from tests.helpers import FAST, MakeReceiver, RunningRelay, eventually


async def _hold(limit: SubscriptionInFlight, entered: list[int], n: int, release: asyncio.Event) -> None:
    async with limit:
        entered.append(n)
        await release.wait()


async def test_one_busy_subscription_gets_its_max_in_flight_and_many_share_the_relays() -> None:
    relay = RelayInFlight(12)
    alone = SubscriptionInFlight(8, relay)
    release = asyncio.Event()
    entered: list[int] = []
    tasks = [asyncio.create_task(_hold(alone, entered, n, release)) for n in range(10)]
    await asyncio.sleep(0.01)
    assert len(entered) == 8 and relay.active == 1  # alone: its own limit, not the relay's share
    others = [SubscriptionInFlight(8, relay) for _ in range(3)]
    got: list[list[int]] = [[] for _ in others]
    tasks += [asyncio.create_task(_hold(o, got[i], 0, release)) for i, o in enumerate(others)]
    await asyncio.sleep(0.01)
    assert relay.active == 4 and relay.share() == 3
    tasks += [asyncio.create_task(_hold(o, got[i], n, release)) for i, o in enumerate(others) for n in range(1, 8)]
    await asyncio.sleep(0.01)
    assert [len(g) for g in got] == [3, 3, 3]  # their share of 12 among 4, not their 8
    assert len(entered) == 8  # above its share now: not cut short, but no more for it
    release.set()
    await asyncio.gather(*tasks)
    assert relay.active == 0 and alone.used == 0 and all(o.used == 0 for o in others)


async def test_the_share_never_falls_below_min_share_and_grows_back_as_others_finish() -> None:
    relay = RelayInFlight(4)
    limits = [SubscriptionInFlight(32, relay) for _ in range(10)]
    releases = [asyncio.Event() for _ in limits]
    got: list[list[int]] = [[] for _ in limits]
    tasks = [asyncio.create_task(_hold(s, got[i], 0, releases[i])) for i, s in enumerate(limits)]
    await asyncio.sleep(0.01)  # all ten sending: then each wants five more
    tasks += [asyncio.create_task(_hold(s, got[i], n, releases[i])) for i, s in enumerate(limits) for n in range(1, 6)]
    await asyncio.sleep(0.01)
    assert relay.share() == MIN_SHARE and all(len(g) == MIN_SHARE for g in got)
    for release in releases[1:]:
        release.set()
    await asyncio.sleep(0.01)
    assert relay.active == 1 and relay.share() == 4
    releases[0].set()
    await asyncio.gather(*tasks)
    assert relay.active == 0


async def test_a_waiter_cancelled_as_it_was_woken_passes_its_place_on() -> None:
    relay = RelayInFlight(4)
    limit = SubscriptionInFlight(1, relay)
    entered: list[int] = []
    first, rest = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(limit, entered, 0, first))
    await asyncio.sleep(0.01)
    cancelled = asyncio.create_task(_hold(limit, entered, 1, rest))
    waiting = asyncio.create_task(_hold(limit, entered, 2, rest))
    await asyncio.sleep(0.01)
    first.set()
    await asyncio.sleep(0)  # the holder leaves and wakes the first waiter ...
    cancelled.cancel()  # ... which is cancelled before it runs
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    await asyncio.sleep(0.01)
    assert entered == [0, 2]
    rest.set()
    await asyncio.gather(holder, waiting)
    assert limit.used == 0 and relay.active == 0


async def test_many_subscriptions_each_keep_to_their_share_of_connections(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    """Six subscriptions, batch 1, a backlog of 60 events each, a relay limit of 6: once all six
    are sending, each has two requests in flight at a time (not up to the relay's six), and its
    endpoint's connections are reused."""
    loop = asyncio.get_running_loop()
    busiest: dict[str, int] = {}
    now: dict[str, int] = {}
    all_sending: list[float] = []

    def slowly(request: Received) -> Slow:
        sub = request.path
        now[sub] = now.get(sub, 0) + 1
        if not all_sending and len(now) == 6:
            all_sending.append(loop.time() + 0.1)  # the first one's opening burst is over by then
        if all_sending and loop.time() > all_sending[0]:
            busiest[sub] = max(busiest.get(sub, 0), now[sub])

        def done() -> None:
            now[sub] -= 1

        loop.call_later(0.02, done)
        return Slow(0.02)

    receivers = [await receiver_factory(slowly) for _ in range(6)]
    for i, (_, url) in enumerate(receivers):
        await conn.execute("select ferry.subscribe($1, array['s'], $2)", f"s{i}", f"{url}/s{i}")
    await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(60)])
    relay = RunningRelay(db_url, dataclasses.replace(FAST, max_in_flight=6))
    try:

        async def all_there() -> bool:
            return all(
                sorted(orjson.loads(r.body)["n"] for r in receiver.received) == list(range(60))
                for receiver, _ in receivers
            )

        await eventually(all_there, timeout=30)
    finally:
        await relay.stop()
    assert len(busiest) == 6 and max(busiest.values()) <= MIN_SHARE, busiest
    assert sum(receiver.stats.connections for receiver, _ in receivers) <= 6 * MIN_SHARE + 6
