"""The SSE API read by Node's eventsource@2 (npm's cache first, else the npm registry; skipped
without node, npm or either), through a proxy that cuts its connections inside an event's ``data:`` line."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

import pgferry
from tests.helpers import StartApi

#: Prints each event's payload.n as it is dispatched, and "end" at the end event.
CLIENT = """
const EventSource = require("eventsource");
const es = new EventSource(process.argv[2]);
es.onmessage = (e) => console.log(JSON.parse(e.data).payload.n);
es.addEventListener("end", () => { console.log("end"); es.close(); });
es.onerror = () => { if (es.readyState === EventSource.CLOSED) { console.log("closed"); process.exit(1); } };
"""


@pytest.fixture
def eventsource2(tmp_path: Path) -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    installed = subprocess.run(
        ["npm", "install", "--prefer-offline", "--no-audit", "--no-fund", "--silent", "eventsource@2"],
        cwd=tmp_path, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        pytest.skip(f"eventsource@2 could not be installed: {installed.stderr.decode()[-200:]}")
    (tmp_path / "client.js").write_text(CLIENT)
    return tmp_path / "client.js"


async def test_node_eventsource2_cut_inside_an_event_resumes_before_it(
    start_api: StartApi, ferry: pgferry.Ferry, eventsource2: Path
) -> None:
    """eventsource@2 takes an id when it parses its line: with ``id:`` before ``data:``, a cut
    inside the data line resumed after the event it was reading (62 of 2,694 lost; outside probe)."""
    api = await start_api(allow_loopback=True)
    host, port = api.base.removeprefix("http://").rsplit(":", 1)
    await ferry.publish_many([{"stream": "cut", "payload": {"n": n, "pad": "x" * 3000}} for n in range(12)])
    await ferry.close_stream("cut")
    cuts = 0

    async def proxy(client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        """The first two connections are cut 100 bytes into the data line of their 4th event."""
        nonlocal cuts
        head = await client_in.readuntil(b"\r\n\r\n")
        relay_in, relay_out = await asyncio.open_connection(host, int(port))
        relay_out.write(head)
        cut, seen = cuts < 2, b""
        while data := await relay_in.read(65536):
            if cut:
                seen += data
                starts = [m.start() for m in re.finditer(rb"data: \{", seen)]
                if len(starts) < 4:
                    continue
                client_out.write(seen[: starts[3] + 100])
                cuts += 1
                break
            client_out.write(data)
            await client_out.drain()
        client_out.close()
        relay_out.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/streams/cut"
    try:
        node = await asyncio.create_subprocess_exec(
            "node", str(eventsource2), url, cwd=eventsource2.parent, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(node.communicate(), 30)
    finally:
        server.close()
    lines = out.decode().split()
    assert cuts == 2 and lines[-1] == "end", lines
    assert [orjson.loads(n) for n in lines[:-1]] == list(range(12))  # each once, none lost
