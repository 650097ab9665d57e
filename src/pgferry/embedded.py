"""A throwaway local PostgreSQL, for the demo (`pgferry run` with no URL) and the tests.

It uses the machine's own server binaries (``initdb``/``pg_ctl`` on PATH or
under /usr/lib/postgresql). PostgreSQL refuses to run as root, so when we are
root the cluster is created and run as the ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from pgferry.errors import EmbeddedPostgresError

DEFAULT_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "wal_level": "logical",
    "max_wal_size": "2GB",
    "log_min_messages": "warning",
    "log_statement": "none",
}


def find_bin_dir() -> Path:
    """Directory holding initdb and pg_ctl: PATH first, then Debian's layout (newest version)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found (initdb, pg_ctl); install PostgreSQL "
        "(e.g. `apt-get install postgresql`) or pass --database-url to use an existing server"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL cluster in a temporary directory, removed on stop()."""

    def __init__(self, *, port: int | None = None, settings: Mapping[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.bin_dir = find_bin_dir()
        self.base_dir = Path(tempfile.mkdtemp(prefix="pgferry-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "postgres.log"
        self._run_as = self._pick_user()
        if self._run_as is not None:
            os.chown(self.base_dir, self._run_as.pw_uid, self._run_as.pw_gid)

    @staticmethod
    def _pick_user() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
        raise EmbeddedPostgresError("running as root and there is no 'postgres' user to run PostgreSQL as")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self._run_as is not None:
            cmd = ["runuser", "-u", self._run_as.pw_name, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.base_dir, check=False)
        if check and proc.returncode != 0:
            raise EmbeddedPostgresError(
                f"{args[0]} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
                + self._log_tail()
            )
        return proc

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(lines) if lines else ""

    def start(self) -> str:
        """Create (first time) and start the cluster; return its URL."""
        if not self.data_dir.exists():
            self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60",
            "-o", f"-p {self.port} -k {self.base_dir} {options}", "start",
        )  # fmt: skip
        return self.url

    def stop(self, mode: str = "fast") -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast`` or ``immediate``, which is a crash) and start again on the same port."""
        self.stop(mode)
        self.start()

    def make_standby(self, *, port: int | None = None) -> EmbeddedPostgres:
        """A streaming standby of this running cluster (``pg_basebackup -R``), with the same
        settings, not started yet; ``promote()`` makes it a primary."""
        standby = EmbeddedPostgres(port=port, settings=self.settings)
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "-D", str(standby.data_dir), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        return standby

    def promote(self) -> None:
        """Promote this standby (waits until it accepts writes)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "promote")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)


@contextlib.contextmanager
def embedded_postgres(settings: Mapping[str, str] | None = None) -> Iterator[EmbeddedPostgres]:
    """Start a throwaway cluster for the duration of the block."""
    pg = EmbeddedPostgres(settings=settings)
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()
