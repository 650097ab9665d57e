"""A Python publisher for `pgferry bench streams`: `python -m pgferry.bench.streams.writer`.

``Ferry.publish()`` as an application calls it: one event per call (calls that
overlap share a transaction; with ``--single`` each is its own), from ``--tasks``
asyncio tasks sharing a pool of as many connections, for ``--seconds``, as fast as they go (or at ``--rate`` events/s
in all). Streams are taken in turn, so each of ``--count`` streams gets its
share. It runs in its own process so that its CPU is its own, as an
application's would be, and is read from /proc by the bench.

Each payload is ``{"t": <wall clock, s>, "n": <sequence>}``, stamped just
before the call: latency measured from it includes the publish round trip
and its commit; ``call_p99_ms`` is the 99th percentile of the calls alone.
The result goes to the file ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import pgferry


async def publish(
    url: str, streams: list[str], tasks: int, seconds: float, rate: float | None, *, grouped: bool = True
) -> dict[str, Any]:
    published = 0
    errors: dict[str, int] = {}
    calls_ms: list[float] = []
    async with pgferry.connect(url, pool_size=tasks, group_publishes=grouped) as ferry:
        started = time.monotonic()
        deadline = started + seconds
        interval = tasks / rate if rate else 0.0

        async def lane(lane_no: int) -> None:
            nonlocal published
            i = lane_no
            due = started + lane_no * interval / tasks
            while True:
                now = time.monotonic()
                if now >= deadline:
                    return
                if interval:
                    if due > now:
                        await asyncio.sleep(due - now)
                    due += interval
                try:
                    called = time.perf_counter()
                    await ferry.publish(streams[i % len(streams)], {"t": time.time(), "n": i})
                    calls_ms.append((time.perf_counter() - called) * 1000.0)
                    published += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                i += tasks

        await asyncio.gather(*(lane(k) for k in range(tasks)))
        elapsed = time.monotonic() - started
    calls_ms.sort()
    p99 = calls_ms[int(len(calls_ms) * 0.99)] if calls_ms else float("nan")
    return {"published": published, "seconds": elapsed, "errors": errors, "call_p99_ms": p99}


def main(argv: list[str]) -> None:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m pgferry.bench.streams.writer")
    parser.add_argument("--url", required=True)
    parser.add_argument("--stream", required=True, help="a stream name, or a pattern with {} and --count")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--rate", type=float, help="events/s in all (default: as fast as they go)")
    parser.add_argument("--single", action="store_true", help="group_publishes=False: a transaction per call")
    parser.add_argument("--out", required=True, type=Path, help="where the result goes (JSON)")
    args = parser.parse_args(argv)
    streams = [args.stream.format(i) for i in range(args.count)] if "{}" in args.stream else [args.stream]
    result = uvloop.run(publish(args.url, streams, args.tasks, args.seconds, args.rate, grouped=not args.single))
    args.out.write_bytes(orjson.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
