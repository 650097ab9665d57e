"""A benchmark receiver process that keeps score: `python -m pgferry.bench.tracking_receiver`.

It runs in its own process (its own core budget) and answers webhooks with
200, or with 500 / a dropped connection at the given rates. For every
answered event it records the event id and commit-to-receipt latency (the
captured row's ``harvested_at`` is the commit time, give or take the
statement's own duration). ``GET /__stats`` returns the score as JSON (counts
only: a bench polls it several times a second), ``GET /__latencies`` the
latencies once at the end; the first line on stdout is the receiver's URL.

Answering only notes the request; bodies are parsed when the score is asked
for, so that while the inserts run the receiver costs what one answering 200
at once would, and leaves the CPU to the system under test.

For `pgferry bench outage` it can also be down on command: ``GET
/__mode/503`` answers every webhook with 503, ``/__mode/hang`` never answers,
``/__mode/up`` answers again; the score counts webhook requests per mode and
notes when the first 2xx after coming back went out. ``--port`` and
``--wait-for-go`` let a second process take over a stopped one's port the
moment a line arrives on stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from datetime import datetime
from typing import Any

import orjson
import uvloop

from pgferry.receiver import Action, Drop, Hang, Received, Receiver, Respond

STATS_PATH = "/__stats"
#: Every commit-to-receipt latency (ms) since the last reset, as a JSON array: asked once, at the
#: end. In the score polled 5 times a second they were megabytes of JSON each time (300,000
#: events): a quarter of the two cores went to the bench measuring itself (top, `bench scale`).
LATENCIES_PATH = "/__latencies"
#: ``/__mode/503``, ``/__mode/hang``, ``/__mode/up``: how webhooks are answered from now on.
MODE_PATH = "/__mode/"
MODES = ("up", "503", "hang")
#: Every event id answered 2xx so far, as a JSON array.
IDS_PATH = "/__ids"
#: Start scoring afresh (after a warm-up); events seen before still count as duplicates if they come again.
#: The answer is the score it ended, as ``/__stats`` would have given it.
RESET_PATH = "/__reset"


class Score:
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.duplicates = 0
        self.duplicate_same_id = 0
        self.bodies_by_msg: dict[str, int] = {}
        self.latencies_ms: list[float] = []
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.requests = 0
        self.failed = 0
        self.pending: list[Received] = []
        self.seen_before_reset = 0
        self.mode = "up"
        self.requests_by_mode: dict[str, int] = dict.fromkeys(MODES, 0)
        #: when the mode last became "up", and the first 2xx answered since (time.time())
        self.up_at: float | None = None
        self.first_ok_at: float | None = None
        #: when the newest event id was first answered 2xx
        self.last_new_at: float | None = None

    def set_mode(self, mode: str) -> None:
        if mode == "up" and self.mode != "up":
            self.up_at, self.first_ok_at = time.time(), None
        self.mode = mode

    def reset(self) -> None:
        self.settle()
        self.seen_before_reset = len(self.seen)
        self.duplicates = self.duplicate_same_id = self.requests = self.failed = 0
        self.latencies_ms = []
        self.first_at = self.last_at = None

    def settle(self) -> None:
        """Score the requests answered since the last call."""
        pending, self.pending = self.pending, []
        for request in pending:
            self.record(request)

    def record(self, request: Received) -> None:
        body = orjson.loads(request.body)
        items = body["data"] if isinstance(body, dict) and "data" in body else None
        msg_id = request.headers.get("webhook-id", "")
        digest = hash(request.body)
        if msg_id in self.bodies_by_msg and self.bodies_by_msg[msg_id] == digest:
            self.duplicate_same_id += 1
        self.bodies_by_msg[msg_id] = digest
        events: list[tuple[int, dict[str, Any]]] = []
        if items is not None:
            events.extend((item["id"], item["payload"]) for item in items)
        elif msg_id:
            events.append((int(msg_id.removeprefix("evt_")), body))
        else:  # a pg_net-style request: the body is the row itself
            events.append((int(body["id"]), {"record": body}))
        for event_id, payload in events:
            if event_id in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(event_id)
            self.last_new_at = request.at
            stamp = (payload.get("record") or {}).get("harvested_at")
            if stamp:
                self.latencies_ms.append((request.at - datetime.fromisoformat(stamp).timestamp()) * 1000)
        self.first_at = self.first_at or request.at
        self.last_at = request.at

    def as_json(self) -> bytes:
        return orjson.dumps(
            {
                "unique": len(self.seen) - self.seen_before_reset,
                "duplicates": self.duplicates,
                "duplicate_requests_same_id_and_body": self.duplicate_same_id,
                "requests": self.requests,
                "failed_on_purpose": self.failed,
                "first_at": self.first_at,
                "last_at": self.last_at,
                "mode": self.mode,
                "requests_by_mode": self.requests_by_mode,
                "up_at": self.up_at,
                "first_ok_at": self.first_ok_at,
                "last_new_at": self.last_new_at,
            }
        )


def control(score: Score, request: Received) -> Action | None:
    """The answer to a request on one of the control paths (None: a webhook)."""
    if request.path in (STATS_PATH, LATENCIES_PATH):
        score.settle()
        return Respond(200, score.as_json() if request.path == STATS_PATH else orjson.dumps(score.latencies_ms))
    if request.path == RESET_PATH:  # answers with the score it ends (nothing comes between)
        score.settle()
        ended = score.as_json()
        score.reset()
        return Respond(200, ended)
    if request.path == IDS_PATH:
        score.settle()
        return Respond(200, orjson.dumps(sorted(score.seen)))
    if request.path.startswith(MODE_PATH):
        mode = request.path.removeprefix(MODE_PATH)
        if mode not in MODES:
            return Respond(400, f"mode must be one of {', '.join(MODES)}".encode())
        score.set_mode(mode)
        return Respond()
    return None


def behaviour(score: Score, fail_rate: float, drop_rate: float, rng: random.Random):  # type: ignore[no-untyped-def]
    def answer(request: Received) -> Action:
        answered = control(score, request)
        if answered is not None:
            return answered
        score.requests += 1
        score.requests_by_mode[score.mode] += 1
        if score.mode == "503":
            return Respond(503, b"down for maintenance")
        if score.mode == "hang":
            return Hang()
        roll = rng.random()
        if roll < fail_rate:
            score.failed += 1
            return Respond(500, b"failing on purpose")
        if roll < fail_rate + drop_rate:
            score.failed += 1
            return Drop()
        score.pending.append(request)
        if score.first_ok_at is None:
            score.first_ok_at = request.at
        return Respond()

    return answer


async def serve(fail_rate: float, drop_rate: float, seed: int, port: int = 0, wait_for_go: bool = False) -> None:
    score = Score()
    receiver = Receiver(behaviour(score, fail_rate, drop_rate, random.Random(seed)), keep=False)
    if wait_for_go:  # started ahead of time: bind the port only when told to
        await asyncio.to_thread(sys.stdin.readline)
    url = await receiver.start(port=port)
    if wait_for_go:
        score.up_at = time.time()  # back: the moment it listens again
    print(url, flush=True)
    await asyncio.Event().wait()  # until the benchmark terminates this process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free one)")
    parser.add_argument("--wait-for-go", action="store_true", help="listen only once a line arrives on stdin")
    args = parser.parse_args()
    start = time.time()
    try:
        uvloop.run(serve(args.fail_rate, args.drop_rate, args.seed, args.port, args.wait_for_go))
    except KeyboardInterrupt:
        print(f"receiver ran {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
