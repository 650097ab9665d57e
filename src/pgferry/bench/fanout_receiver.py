"""The receiver of `pgferry bench fanout`: ``python -m pgferry.bench.fanout_receiver --ports N``.

Listens on N loopback ports (N endpoints, each its own connection pool on the
relay's side), answers every webhook 200 at once and notes (path, body,
arrival time). Runs in its own process so that it spends its own core
budget. Its first stdout line is a JSON array of the ports; every line on
stdin asks for the score, answered with one JSON line: per path, the event
numbers received (duplicates kept), and commit-to-receipt latencies (the
payload's ``t`` is the publishing statement's clock_timestamp()).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from typing import Any

import orjson
import uvloop

from pgferry.receiver import Receiver, Respond


def score(receivers: list[Receiver]) -> dict[str, Any]:
    by_path: dict[str, list[int]] = defaultdict(list)
    latencies: list[float] = []
    last = 0.0
    for receiver in receivers:
        for r in receiver.received:
            body = orjson.loads(r.body)
            by_path[r.path].append(int(body["n"]))
            latencies.append((r.at - float(body["t"])) * 1000)
            last = max(last, r.at)
    return {"by_path": by_path, "latencies_ms": latencies, "last_at": last}


async def main(ports: int) -> None:
    receivers = [Receiver(lambda _: Respond()) for _ in range(ports)]
    for receiver in receivers:
        await receiver.start(path="")
    print(orjson.dumps([r.port for r in receivers]).decode(), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        sys.stdout.write(orjson.dumps(score(receivers)).decode() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ports", type=int, default=1000)
    uvloop.run(main(parser.parse_args().ports))
