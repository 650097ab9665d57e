"""One Python reader of one stream, for `pgferry bench streams`: `python -m pgferry.bench.streams.pyreader`.

``Ferry.read_stream`` (the Python API, straight from the database, no relay API in
between) from the stream's start until its end, in a process of its own: DBOS's
``read_stream`` beside it is the same kind of reader. Each event's latency is the
wall clock when it is yielded minus its payload's ``t``. One line ``started``, then
what it read as JSON in the file ``--out`` (see ``common.read_result``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import pgferry


async def read(url: str, stream: str, poll_interval: float) -> dict[str, Any]:
    latencies: list[tuple[float, float]] = []
    ferry = pgferry.Ferry(url)
    sys.stdout.write("started\n")
    sys.stdout.flush()
    async for event in ferry.read_stream(stream, poll_interval=poll_interval):
        now = time.time()
        latencies.append((now, (now - float(event.payload["t"])) * 1000.0))
    return {"events": len(latencies), "latencies": latencies}


def main(argv: list[str]) -> None:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m pgferry.bench.streams.pyreader")
    parser.add_argument("--url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--out", required=True, type=Path, help="where the result goes (JSON)")
    args = parser.parse_args(argv)
    result = uvloop.run(read(args.url, args.stream, args.poll_interval))
    args.out.write_bytes(orjson.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
