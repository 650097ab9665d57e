"""`pgferry run --processes N`: N relay processes under one supervisor.

A relay delivers from one Python process, so on its own it uses one core. The
supervisor starts N child relays, each a whole relay with its own relay id,
ownership connection and share of the subscriptions (fair share spreads them
as it spreads them over relays on several hosts), and keeps them running:

* **Signals**: SIGTERM/SIGINT to the supervisor are forwarded to every child as
  SIGTERM, and the supervisor waits for their graceful stop (a second signal is
  forwarded too: the children exit at once). Children run in their own session
  (process group), so a Ctrl-C in a terminal reaches them once, through the
  supervisor, not twice.
* **Crashes**: a child that exits without being asked is restarted after a
  backoff (0.5 s doubling to 30 s; reset once a child has run a minute). A slot
  whose child crashed ``give_up_after`` times in a row, each within a minute of
  its start, is a crash loop: the supervisor stops the others and exits 1 with
  the last exit code in the message, as a single relay would have.
* **No orphans**: a child must never outlive its supervisor (a SIGKILLed
  supervisor is how systemd and the tests stop a relay). On Linux each child
  asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``);
  everywhere, the child's stdin is a pipe from the supervisor that it reads
  until EOF, and EOF means the supervisor is gone: the child exits at once.
  Either way the child dies as the supervisor did, its locks go with its
  connections, and the subscriptions move as after any relay's SIGKILL.

The children get their settings as a pickle on that same pipe (the supervisor
built and checked them, so nothing is parsed twice), tell the supervisor where
their private metrics server listens by a JSON line on stdout, and log to the
supervisor's stderr. One port serves each kind of traffic for the whole set:

* the streams API's listening socket is opened by the supervisor and inherited
  by every child, which all accept on it (the pre-fork model): any port works,
  0 included, a crashed child's connections are picked up by the others, and
  clients reconnect from their last offset as after any relay restart;
* metrics and the dashboard are served by the supervisor (ops/web.py's
  ``SupervisorWeb``, loaded only when a port asks for it): /metrics gathers
  every child's metrics from its private loopback port, labelled
  ``process="SLOT"``; the dashboard reads PostgreSQL, where every child
  heartbeats (ferry.relays).

``--processes 1`` does not come here: the relay runs in the `pgferry run`
process itself, exactly as before the supervisor existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from pgferry.aio import backoff_delay, wait_for_event
from pgferry.errors import PgferryError
from pgferry.relay.process import Relay, RelaySettings
from pgferry.relay.surface import SupervisorView

log = logging.getLogger(__name__)

#: Linux's prctl option that sends the child a signal when its parent exits (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: exit code of a child whose supervisor vanished (EX_SOFTWARE would mislead; 75 is EX_TEMPFAIL)
ORPHANED_EXIT = 75
#: a delivery pool this small still reads a batch while the previous one is acknowledged
MIN_CHILD_DB_POOL = 3


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota.

    A container limited to 2 CPUs on a 64-core host sees 64 cores in its affinity
    mask; 64 relays there would only fight over 2 CPUs and hold 64 sets of
    database connections, so the quota (``cpu.max``) wins when there is one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclass
class SupervisorSettings:
    processes: int
    #: first restart delay of a crashed child (doubles per crash in a row)
    restart_base: float = 0.5
    restart_cap: float = 30.0
    #: a child that ran this long was healthy: its slot's crash count starts over
    healthy_after: float = 60.0
    #: crashes in a row of one slot's child, each before ``healthy_after``, that make a crash loop
    give_up_after: int = 5
    #: seconds to wait for the children's graceful stop before killing them (None: from the
    #: relay settings: the ownership stop grace and a database round's deadline, plus 5 s)
    stop_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise PgferryError(f"--processes must be at least 1 (got {self.processes})")
        if self.give_up_after < 1:
            raise PgferryError("give_up_after must be at least 1")


@dataclass(frozen=True)
class ChildOrder:
    """What the supervisor hands a child on its stdin (a pickle: same program, same user, a private pipe)."""

    url: str
    settings: RelaySettings
    slot: int
    supervisor_pid: int


@dataclass
class _Slot:
    number: int
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    crashes: int = 0
    metrics_url: str | None = None
    reader: asyncio.Task[None] | None = None


@dataclass
class _Counts:
    restarts: int = 0
    running: int = 0


class GaveUp(PgferryError):
    """A child crashed in a loop; the supervisor stopped the set."""


class Supervisor:
    """Runs ``settings.processes`` child relays from ``child_command`` until ``stop`` is set.

    ``child_command`` is the argv of a process that runs ``run_child`` (the CLI's
    hidden ``pgferry run-child``): the supervisor does not know how the CLI is
    started, the CLI does.
    """

    def __init__(
        self,
        url: str,
        relay: RelaySettings,
        settings: SupervisorSettings,
        child_command: Sequence[str],
    ) -> None:
        self.url = url
        self.relay = relay
        self.settings = settings
        self.child_command = list(child_command)
        self.slots = [_Slot(n) for n in range(1, settings.processes + 1)]
        self.counts = _Counts()
        #: where the supervisor's servers listen ("metrics", "dashboard", "api" -> URL)
        self.addresses: dict[str, str] = {}
        self._api_socket: socket.socket | None = None
        self._stopping = False

    @property
    def stop_timeout(self) -> float:
        if self.settings.stop_timeout is not None:
            return self.settings.stop_timeout
        return self.relay.ownership.stop_grace + self.relay.liveness.command_timeout + 5.0

    def child_settings(self) -> RelaySettings:
        """A child's relay settings: the supervisor's, with the shared ports taken over by the supervisor."""
        web = self.relay.web
        api = self.relay.api
        if api is not None and self._api_socket is not None:
            api = replace(api, listen_fd=self._api_socket.fileno())
        return replace(
            self.relay,
            # metrics on a private loopback port the supervisor gathers from; the dashboard in the supervisor
            metrics_port=0 if web.metrics_port is not None else None,
            metrics_host="127.0.0.1",
            dashboard_port=None,
            dashboard_token=None,
            api=api,
            # N children together hold about the database connections one relay holds
            db_pool_size=max(MIN_CHILD_DB_POOL, math.ceil(self.relay.db_pool_size / self.settings.processes)),
            # each claims its share at once, not everything to hand half back once the others show up
            ownership=replace(self.relay.ownership, peers=self.settings.processes),
        )

    def view(self) -> SupervisorView:
        """What the supervisor's operator side may see: the children's metrics addresses and counts."""

        def children() -> dict[str, str]:
            return {str(s.number): s.metrics_url for s in self.slots if s.metrics_url and s.proc is not None}

        def counts() -> dict[str, float]:
            return {"processes": self.settings.processes, "running": self.counts.running,
                    "restarts": self.counts.restarts}  # fmt: skip

        return SupervisorView(
            url=self.url,
            web=self.relay.web,
            children=children,
            counts=counts,
            announce=self.addresses.__setitem__,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Check the database once (a clear error, not N crash loops), start the children, supervise."""
        await Relay(self.url, replace(self.relay, metrics_port=None, dashboard_port=None)).check()
        web = self.relay.web
        surface = None
        if web.wanted:
            # The supervisor's one arrow to ops/, as the relay's (relay/process.py).
            from pgferry.ops.web import SupervisorWeb  # noqa: PLC0415 - optional part, loaded only when served

            surface = SupervisorWeb(self.view())
        if self.relay.api is not None:
            self._api_socket = _listen(self.relay.api.host, self.relay.api.port)
            host, port = self._api_socket.getsockname()[:2]
            self.addresses["api"] = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            log.info("streams API: serving at %s/v1/streams/ from every relay process", self.addresses["api"])
        gave_up: GaveUp | None = None
        try:
            if surface is not None:
                await surface.start()
            log.info("supervisor: starting %d relay processes", len(self.slots))
            watchers = [asyncio.create_task(self._keep(slot, stop)) for slot in self.slots]
            done = await asyncio.gather(*watchers, return_exceptions=True)
            for result in done:
                if isinstance(result, GaveUp):
                    gave_up = result
                elif isinstance(result, BaseException):
                    raise result
        finally:
            self._stopping = True
            stop.set()
            await self._stop_all()
            if surface is not None:
                await surface.stop()
            if self._api_socket is not None:
                self._api_socket.close()
        if gave_up is not None:
            raise gave_up
        log.info("supervisor: every relay process stopped")

    async def _keep(self, slot: _Slot, stop: asyncio.Event) -> None:
        """Run one slot's child until ``stop``; restart it when it dies unasked."""
        while not stop.is_set():
            await self._start(slot)
            assert slot.proc is not None
            exited = asyncio.create_task(slot.proc.wait())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not exited.done():  # asked to stop: _stop_all signals and waits
                exited.cancel()
                return
            code = slot.proc.returncode
            self.counts.running -= 1
            slot.metrics_url = None
            ran = time.monotonic() - slot.started
            how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited ({code})"
            if code == 0:
                # A clean stop (an operator's SIGTERM or SIGINT to that child alone) is no crash: it
                # counted towards the crash-loop give-up (outside probe). It is started again: at once
                # after a healthy run, after restart_base when it ran only briefly (no tight loop).
                log.info("supervisor: relay process %d (pid %d) stopped cleanly after %.1f s; starting it again",
                         slot.number, slot.proc.pid, ran)  # fmt: skip
                slot.crashes = 0
                if ran < self.settings.healthy_after:
                    await wait_for_event(stop, self.settings.restart_base)
                if not stop.is_set():
                    self.counts.restarts += 1
                continue
            slot.crashes = 1 if ran >= self.settings.healthy_after else slot.crashes + 1
            if slot.crashes >= self.settings.give_up_after:
                message = (
                    f"supervisor: relay process {slot.number} crashed {slot.crashes} times in a row, each within "
                    f"{self.settings.healthy_after:.0f} s of starting (last: pid {slot.proc.pid} {how}); "
                    "giving up and stopping the others: see the log lines above for the cause"
                )
                log.error("%s", message)
                stop.set()
                raise GaveUp(message)
            delay = backoff_delay(slot.crashes, base=self.settings.restart_base, cap=self.settings.restart_cap)
            log.warning(
                "supervisor: relay process %d (pid %d) %s after %.1f s; restarting it in %.1f s (crash %d in a row)",
                slot.number, slot.proc.pid, how, ran, delay, slot.crashes,
            )  # fmt: skip
            await wait_for_event(stop, delay)
            if not stop.is_set():
                self.counts.restarts += 1

    async def _start(self, slot: _Slot) -> None:
        order = ChildOrder(self.url, self.child_settings(), slot.number, os.getpid())
        fds = (self._api_socket.fileno(),) if self._api_socket is not None else ()
        # Started from this (the main) thread: PR_SET_PDEATHSIG fires when the thread
        # that forked the child ends, so forking from a worker thread would kill the
        # child with that thread.
        proc = await asyncio.create_subprocess_exec(
            *self.child_command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=fds,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(pickle.dumps(order))
        await proc.stdin.drain()  # the pipe stays open: its EOF tells the child we are gone
        slot.proc = proc
        slot.started = time.monotonic()
        self.counts.running += 1
        slot.reader = asyncio.create_task(self._listen_to(slot, proc.stdout))
        log.info("supervisor: relay process %d started (pid %d)", slot.number, proc.pid)

    async def _listen_to(self, slot: _Slot, out: asyncio.StreamReader) -> None:
        """A child's announcements: one JSON object per line, e.g. {"metrics": "http://127.0.0.1:PORT/metrics"}."""
        while line := await out.readline():
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if isinstance(said, dict) and isinstance(said.get("metrics"), str):
                slot.metrics_url = said["metrics"]

    def forward(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every running child."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    async def _stop_all(self) -> None:
        """SIGTERM every child, wait for their graceful stop, kill those still running after stop_timeout."""
        self.forward(signal.SIGTERM)
        running = [s.proc for s in self.slots if s.proc is not None and s.proc.returncode is None]
        waits = [asyncio.create_task(p.wait()) for p in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=self.stop_timeout)
            if late:
                log.warning("supervisor: %d relay process(es) did not stop in %.0f s; killing them",
                            len(late), self.stop_timeout)  # fmt: skip
                for proc in running:
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                await asyncio.gather(*waits, return_exceptions=True)
        for slot in self.slots:
            if slot.reader is not None:
                slot.reader.cancel()
            if slot.proc is not None and slot.proc.stdin is not None:
                slot.proc.stdin.close()
        self.counts.running = 0


def _listen(host: str, port: int) -> socket.socket:
    """The streams API's listening socket, opened once for every child to accept on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise PgferryError(f"streams API: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(4096)
    except OSError as exc:
        sock.close()
        raise PgferryError(f"streams API: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


# -- the child's side -----------------------------------------------------------


def read_order(stdin: IO[bytes]) -> ChildOrder:
    """Read the supervisor's order, then make sure this child dies with the supervisor.

    Called first thing in the child, before it connects anywhere."""
    order = pickle.load(stdin)
    if not isinstance(order, ChildOrder):
        raise PgferryError("this is the child side of `pgferry run --processes N`; run `pgferry run` instead")
    _die_with_parent()
    if os.getppid() != order.supervisor_pid:  # the supervisor died before the kernel was told
        os._exit(ORPHANED_EXIT)

    fd = stdin.fileno()

    def watch() -> None:
        # EOF on the pipe: the supervisor is gone (where PR_SET_PDEATHSIG is not there to kill us).
        # Read from the descriptor, not the buffered file: a thread blocked inside the buffered
        # reader's lock would stop the interpreter from exiting at all.
        with contextlib.suppress(OSError):
            while os.read(fd, 4096):
                pass
        os.write(2, b"pgferry: the supervisor is gone; this relay process exits now\n")
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="supervisor lifeline", daemon=True).start()
    return order


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning(
                "supervisor: prctl(PR_SET_PDEATHSIG) failed (errno %d); relying on the pipe", ctypes.get_errno()
            )
    except (OSError, AttributeError) as exc:
        log.warning("supervisor: cannot ask to die with the supervisor (%s); relying on the pipe", exc)


def child_relay(order: ChildOrder, announce: Callable[[str], None] | None = None) -> Relay:
    """The relay a child runs: its settings, tagged with the supervisor and slot, and its metrics
    address told to the supervisor (a JSON line on stdout unless ``announce`` says otherwise)."""

    def tell(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    say = announce or tell
    settings = replace(order.settings, group=f"{order.supervisor_pid}.{order.slot}")
    relay = Relay(order.url, settings)
    relay.on_announce = lambda kind, url: say(json.dumps({kind: url})) if kind == "metrics" else None
    return relay


__all__ = [
    "ChildOrder",
    "GaveUp",
    "Supervisor",
    "SupervisorSettings",
    "child_relay",
    "read_order",
    "usable_cores",
]
