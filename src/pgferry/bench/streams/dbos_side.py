"""DBOS streams, for `pgferry bench streams --dbos-python PATH`: run by a Python that has the dbos package.

It never imports pgferry (the dbos package lives in a venv of its own), so it is a
script: ``PATH dbos_side.py write|read ...``. Both sides stamp and time events as
the pgferry side does (``bench.streams.writer`` and ``bench.streams.pyreader``): the
writer puts ``{"t": wall clock, "n": seq}`` in each value just before its
``DBOS.write_stream`` call, the reader notes the wall clock when ``read_stream``
yields it.

- ``write``: a DBOS application with one workflow that writes its stream as fast as
  it can for ``--seconds`` (each ``write_stream`` in a workflow is a step: its own
  transaction, recorded for replay), then closes it. One line ``started`` once the
  workflow runs (it waits ``--lead`` seconds before writing, so the reader can
  start first), then its count as JSON in ``--out``.
- ``read``: a ``DBOSClient`` reading the workflow's stream from offset 0 until it is
  closed; what it read as JSON in ``--out``. As the client comes by default it polls (every second);
  ``--listen-notify`` has it woken by NOTIFY instead, DBOS's fastest reader.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

KEY = "bench"


def write(url: str, workflow_id: str, seconds: float, lead: float) -> dict[str, Any]:
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "pgferry-bench", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos is not installed where mypy runs
    def writer(seconds: float, lead: float) -> int:
        time.sleep(lead)
        deadline = time.time() + seconds
        n = 0
        while time.time() < deadline:
            DBOS.write_stream(KEY, {"t": time.time(), "n": n})
            n += 1
        DBOS.close_stream(KEY)
        return n

    DBOS.launch()
    try:
        with SetWorkflowID(workflow_id):
            handle = DBOS.start_workflow(writer, seconds, lead)
        print("started", flush=True)
        started = time.time()
        written = int(handle.get_result())
        return {"written": written, "seconds": time.time() - started - lead}
    finally:
        DBOS.destroy()


def read(url: str, workflow_id: str, listen_notify: bool) -> dict[str, Any]:
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url, use_listen_notify=listen_notify)
    latencies: list[tuple[float, float]] = []
    try:
        print("started", flush=True)
        for value in client.read_stream(workflow_id, KEY):
            now = time.time()
            latencies.append((now, (now - float(value["t"])) * 1000.0))
    finally:
        client.destroy()
    return {"events": len(latencies), "latencies": latencies}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="dbos_side.py")
    parser.add_argument("mode", choices=("write", "read"))
    parser.add_argument("--url", required=True, help="the DBOS system database")
    parser.add_argument("--workflow-id", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lead", type=float, default=2.0)
    parser.add_argument("--out", required=True, help="where the result goes (JSON)")
    parser.add_argument("--listen-notify", action="store_true", help="read: woken by NOTIFY, not polling")
    args = parser.parse_args(argv)
    if args.mode == "write":
        result = write(args.url, args.workflow_id, args.seconds, args.lead)
    else:
        result = read(args.url, args.workflow_id, args.listen_notify)
    with open(args.out, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(sys.argv[1:])
