"""The receiver of `pgferry bench fanout`: ``python -m pgferry.bench.fanout_receiver --ports N``.

Listens on N loopback ports (N endpoints, each its own connection pool on the
relay's side), answers every webhook 200 at once and notes (path, body,
arrival time). With ``--stall S`` it holds every answer for S seconds once,
from two seconds after the first request (a receiver's pause: a deploy, a GC,
a saturated host), so that what a pause costs can be measured on demand.
Runs in its own process so that it spends its own core budget. Its first
stdout line is a JSON array of the ports; every line on stdin asks for the
score, answered with one JSON line: per path, the event numbers received
(duplicates kept), commit-to-receipt latencies (the
payload's ``t`` is the publishing statement's clock_timestamp()), connections
accepted and the most open at once (sampled every 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import defaultdict
from typing import Any

import orjson
import uvloop

from pgferry.receiver import Action, Received, Receiver, Respond, Slow

#: Seconds after the first request that a --stall pause begins.
STALL_AFTER = 2.0


class Pause:
    """Answers at once, but holds every request arriving in one window of ``seconds`` (starting
    STALL_AFTER after the first request) until the window ends."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start: float | None = None

    def __call__(self, _: Received) -> Action:
        now = time.monotonic()
        if self.start is None:
            self.start = now + STALL_AFTER
        if self.seconds > 0 and self.start <= now < self.start + self.seconds:
            return Slow(self.start + self.seconds - now)
        return Respond()


class Peak:
    """The most connections open at once over all receivers, sampled."""

    def __init__(self, receivers: list[Receiver]) -> None:
        self.receivers = receivers
        self.most = 0

    async def sample(self) -> None:
        while True:
            self.most = max(self.most, sum(len(r.stats.open) for r in self.receivers))
            await asyncio.sleep(0.05)


def score(receivers: list[Receiver], peak: Peak) -> dict[str, Any]:
    by_path: dict[str, list[int]] = defaultdict(list)
    latencies: list[float] = []
    last = 0.0
    for receiver in receivers:
        for r in receiver.received:
            body = orjson.loads(r.body)
            by_path[r.path].append(int(body["n"]))
            latencies.append((r.at - float(body["t"])) * 1000)
            last = max(last, r.at)
    return {
        "by_path": by_path, "latencies_ms": latencies, "last_at": last,
        "connections": sum(r.stats.connections for r in receivers), "peak_open": peak.most,
    }  # fmt: skip


async def main(ports: int, stall: float) -> None:
    pause = Pause(stall)
    receivers = [Receiver(pause) for _ in range(ports)]
    for receiver in receivers:
        await receiver.start(path="")
    peak = Peak(receivers)
    sampler = asyncio.create_task(peak.sample())
    print(orjson.dumps([r.port for r in receivers]).decode(), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        sys.stdout.write(orjson.dumps(score(receivers, peak)).decode() + "\n")
        sys.stdout.flush()
    sampler.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ports", type=int, default=1000)
    parser.add_argument("--stall", type=float, default=0.0)
    args = parser.parse_args()
    uvloop.run(main(args.ports, args.stall))
