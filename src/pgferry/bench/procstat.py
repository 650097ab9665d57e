"""CPU time and memory of the bench's processes, from /proc (Linux; no psutil needed).

Why: on two cores the relay, the clients, the writer and PostgreSQL compete
for the same CPU, so a rate means little without who spent it. A party's CPU
seconds are read before and after a window; divided by the window, 100% is
one core.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    except OSError:
        return None


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU of a process (all its threads) so far, and with ``reaped`` that of its
    children it has waited for; 0 when it is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICKS


def parent(pid: int) -> int | None:
    """The parent of a process (a backend's: the postmaster); None when it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields is not None else None


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def tree_cpu_seconds(root: int) -> float:
    """CPU of ``root`` and its children, live or gone (a postmaster and its backends): a backend
    that exits is added to its parent's reaped time, so differences over a window stay right."""
    return cpu_seconds(root, reaped=True) + sum(cpu_seconds(pid) for pid in children(root))


def cpu_by_command(markers: Mapping[str, str]) -> dict[str, float]:
    """CPU so far of the live processes whose command line holds each role's marker, summed per
    role (``{"relay": "pgferry run"}``): for processes that live through a window, such as a
    bench's relay and broker, whichever started them."""
    found = dict.fromkeys(markers, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for role, marker in markers.items():
            if marker in command:
                found[role] += cpu_seconds(int(entry))
    return found


def cpu_spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each role's CPU between two readings of ``cpu_by_command``."""
    return {role: after[role] - before[role] for role in after}


def reaped_cpu_seconds() -> float:
    """CPU of this process's children it has waited for (a writer subprocess that has finished)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now), VmHWM (its peak so far) and VmPeak (the peak of the address space, virtual)
    in MiB; empty when the process is gone."""
    found: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "VmPeak"):
                    found[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return found
