"""The process's limit of open files, raised to what its sockets need.

Every webhook connection, stream reader and database connection is a file;
the soft limit is often 1,024 while the hard limit allows far more, and a
process past its soft limit gets EMFILE on its next connect or accept.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

#: Open files a process keeps beside the sockets it sizes by the limit (the streams API's readers,
#: delivery's idle webhook connections): database connections, listening sockets, brokers, logs.
FD_RESERVE = 256


def raise_open_files(who: str, want: int) -> int | None:
    """Raise this process's soft limit of open files to its hard limit (to ``want`` when the hard
    limit is infinite); return the soft limit now in force, None for infinite. ``who`` starts
    the log lines."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft == infinite:
        return None
    target = hard if hard != infinite else max(soft, want)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("%s: open files limit raised from %d to %d", who, soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("%s: cannot raise the open files limit from %d to %d (%s)", who, soft, target, exc)
    return soft
