"""Real HTTP servers on 127.0.0.1 for the webhook sender's conformance tests.

Each server answers the same few paths the same way (``ANSWERS``: ``/ok`` is 200 "ok",
``/fail`` is 500 "boom", a ``-chunked`` suffix streams the body in two parts), and
reports which connection every request came on (``connections()``, oldest first), so a
test can tell whether keep-alive was really used. The servers are started and stopped
by fixtures in ``conftest.py``; ``post`` is how every test calls the sender.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import orjson
import uvicorn
from aiohttp import web

from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpResult
from pgferry.embedded import free_port

#: what each server answers per path: status, body
ANSWERS = {"/ok": (200, b"ok"), "/fail": (500, b"boom")}
#: streamed bodies come in these parts, so a "boom" is split across two chunks
PARTS = 2


class RealServer(Protocol):
    def url(self, path: str) -> str: ...

    def connections(self) -> list[str]:
        """The connection every request answered so far came on, oldest first."""
        ...


def answer_for(path: str) -> tuple[int, bytes, bool]:
    """Status, body and whether to stream it (chunked) for a request to ``path``."""
    streamed = path.endswith("-chunked")
    status, body = ANSWERS.get(path.removesuffix("-chunked"), (404, b"no such path"))
    return status, body, streamed


def parts_of(body: bytes) -> list[bytes]:
    half = len(body) // PARTS
    return [body[:half], body[half:]]


async def post(sender: FastSender, url: str, body: bytes = b'{"a": 1}', *, timeout: float = 2.0) -> HttpResult:
    """POST like the relay does; the guard fails the test instead of letting a sender hang it."""
    return await asyncio.wait_for(
        sender.send(url, body, {"content-type": "application/json"}, timeout=timeout, connect_timeout=1.0),
        timeout + 1.0,
    )


def wait_for_port(port: int, timeout: float = 10.0, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing answers on 127.0.0.1:{port} after {timeout} s")


class Nginx:
    """Debian's nginx in the foreground, one process, everything it writes in a temp dir."""

    #: the nginx binary, or None when it is not installed (scripts/bootstrap.sh installs it)
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pgferry-nginx-"))
        self.port = free_port()
        self.access_log = self.dir / "access.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def config(self) -> str:
        d = self.dir
        return f"""
daemon off;
master_process off;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    log_format conn '$connection $connection_requests $request_uri $status';
    access_log {d}/access.log conn;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    default_type text/plain;
    keepalive_timeout 30s;
    keepalive_requests 1000;
    server {{
        listen 127.0.0.1:{self.port};
        location = /ok {{ return 200 "ok"; }}
        location = /fail {{ return 500 "boom"; }}
        location = /gone {{ return 410; }}
        location = /redirect {{ return 302 http://127.0.0.1:{self.port}/ok; }}
        location = /nocontent {{ return 204; }}
    }}
}}
"""

    def start(self) -> None:
        assert self.binary is not None
        conf = self.dir / "nginx.conf"
        conf.write_text(self.config())
        self.process = subprocess.Popen(
            [self.binary, "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        process = self.process
        try:
            wait_for_port(self.port, alive=lambda: process.poll() is None)
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"nginx did not start: {self.errors()}") from None

    def errors(self) -> str:
        log = self.dir / "error.log"
        return log.read_text() if log.exists() else ""

    def connections(self) -> list[str]:
        """nginx's connection serial number for every request logged so far."""
        if not self.access_log.exists():
            return []
        return [line.split(" ", 1)[0] for line in self.access_log.read_text().splitlines()]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stderr is not None:
                self.process.stderr.close()
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Uvicorn:
    """uvicorn with its pure-Python h11 protocol, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        #: (headers, body) of every request, header names lowercased
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            http="h11",
            interface="asgi3",
            loop="asyncio",
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def app(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        body = b""
        while more:  # read the whole body first, as a real endpoint would
            message = await receive()
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
        self.requests.append(({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}, body))
        host, port = scope["client"]
        self.seen.append(f"{host}:{port}")
        status, body, streamed = answer_for(scope["path"])
        headers = [(b"content-type", b"text/plain")]
        if not streamed:
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if streamed:  # no length given: h11 sends it chunked
            for part in parts_of(body):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send({"type": "http.response.body", "body": body})

    def connections(self) -> list[str]:
        return list(self.seen)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


class Aiohttp:
    """aiohttp.web on the tests' own event loop."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.port = 0
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        host, port = request.transport.get_extra_info("peername")
        self.seen.append(f"{host}:{port}")
        status, body, streamed = answer_for(request.path)
        if not streamed:
            return web.Response(status=status, body=body, content_type="text/plain")
        response = web.StreamResponse(status=status)
        response.content_type = "text/plain"
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in parts_of(body):
            await response.write(part)
            await asyncio.sleep(0.005)  # two chunks, really
        await response.write_eof()
        return response

    def connections(self) -> list[str]:
        return list(self.seen)

    async def start(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        await self.runner.setup()
        await web.SockSite(self.runner, sock).start()

    async def stop(self) -> None:
        await self.runner.cleanup()


class _Http10Handler(http.server.BaseHTTPRequestHandler):
    """What ``python -m http.server``-style handlers do: HTTP/1.0, no Content-Length,
    the body ends when the server closes the connection."""

    protocol_version = "HTTP/1.0"
    server: Http10

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(f"{self.client_address[0]}:{self.client_address[1]}")
        status, body, _ = answer_for(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Http10(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Http10Handler)
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def connections(self) -> list[str]:
        return list(self.seen)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


_NODE_SERVER = r"""
const http = require("http");
const seen = [];
const answers = {"/ok": [200, "ok"], "/fail": [500, "boom"]};
const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    if (req.url === "/__seen") { res.end(JSON.stringify(seen)); return; }
    seen.push(`${req.socket.remoteAddress}:${req.socket.remotePort}`);
    const chunked = req.url.endsWith("-chunked");
    const [status, body] = answers[chunked ? req.url.slice(0, -8) : req.url] || [404, "no such path"];
    res.statusCode = status;
    res.setHeader("Content-Type", "text/plain");
    if (!chunked) { res.end(body); return; }
    res.write(body.slice(0, body.length >> 1));
    setTimeout(() => res.end(body.slice(body.length >> 1)), 5);
  });
});
server.keepAliveTimeout = Number(process.argv[1]);  // what Node announces as Keep-Alive: timeout=N
server.listen(0, "127.0.0.1", () => console.log(server.address().port));
"""


class Node:
    """Node.js's http module (the machine's `node`), keep-alive as Node does it: it closes an idle
    connection after ``keepAliveTimeout`` and says so in a ``Keep-Alive: timeout=N`` header."""

    binary = shutil.which("node")

    def __init__(self, keep_alive_ms: int = 1000) -> None:
        self.keep_alive_ms = keep_alive_ms
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        assert self.binary is not None
        self.process = subprocess.Popen(
            [self.binary, "-e", _NODE_SERVER, str(self.keep_alive_ms)], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def connections(self) -> list[str]:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(b"GET /__seen HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        return list(orjson.loads(answer.split(b"\r\n\r\n", 1)[1]))

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
