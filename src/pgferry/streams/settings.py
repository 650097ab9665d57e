"""Settings of the streams HTTP API (``pgferry run --api-port``), apart from the server itself so
that the relay's settings can hold them without loading aiohttp."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgferry.errors import PgferryError

_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")


#: readers a relay process serves at once unless told otherwise
DEFAULT_MAX_CLIENTS = 20_000


@dataclass(frozen=True, slots=True)
class ApiSettings:
    #: 0: any free port (announced as the relay's "api" address)
    port: int = 0
    host: str = "127.0.0.1"
    #: origins browsers may call the API from ("*": any)
    cors_origins: tuple[str, ...] = ()
    #: requests from loopback addresses need no token (off by default: a proxy on the same host
    #: would make every request look local)
    allow_loopback: bool = False
    #: live events that may wait for one slow client (more: it reads on from the log instead)
    client_buffer: int = 1000
    #: seconds a write may wait for a client that reads nothing before its connection is cut
    stall_timeout: float = 30.0
    #: seconds between keep-alive comments on an idle SSE response
    heartbeat: float = 15.0
    #: seconds a connection may go without a whole request head, from its start or its last
    #: response (a reader being served is not timed by it: it has heartbeats and stall_timeout)
    idle_timeout: float = 15.0
    #: readers at once (SSE and long-polls); more get 503 and retry
    max_clients: int = DEFAULT_MAX_CLIENTS
    #: events of the whole log read per history range, at most
    range_events: int = 10_000
    #: database connections that big transactions in history are read on (a page at a time, by
    #: every client catching up): the most such clients read at once, the others wait their turn
    history_connections: int = 4
    #: a listening socket's file descriptor to accept on instead of binding host:port (a child of
    #: `pgferry run --processes N`: the supervisor listens once and every child accepts)
    listen_fd: int | None = None

    def __post_init__(self) -> None:
        if min(self.client_buffer, self.max_clients, self.range_events, self.history_connections) < 1:
            raise PgferryError(
                "streams API: client_buffer, max_clients, range_events and history_connections must be at least 1"
            )
        if self.heartbeat <= 0 or self.stall_timeout <= 0 or self.idle_timeout <= 0:
            raise PgferryError(
                "streams API: heartbeat, stall_timeout and idle_timeout must be positive numbers of seconds"
            )
        if not 0 <= self.port <= 65535:
            raise PgferryError(f"streams API: port {self.port} is not a TCP port (0-65535)")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise PgferryError(
                    f"streams API: CORS origin {origin!r} is not an origin; give scheme://host[:port] "
                    "exactly as browsers send it (no path, no trailing slash), or * for any"
                )
