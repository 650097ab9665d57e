"""aiohttp runners that bound the connections they hold: the streams API's, the dashboard's and
the metrics' (``GuardedRunner``).

aiohttp by itself keeps any number of connections, and closes one that sends nothing, or only
part of a request's head, or nothing after a response, only after its keep-alive timeout of
3,630 s. 650 connections that sent nothing took a relay under ``ulimit -n 600`` to its limit: a
webhook could not be connected to (EMFILE, the endpoint wrongly shown down), and the dashboard
and metrics stopped answering (outside probe). So each server here:

- closes a connection that has no whole request head ``idle_timeout`` seconds after it was
  opened or after its last response (aiohttp's keep-alive timer, which runs from both and is
  not reset by bytes that do not complete a head: a head dribbled a byte at a time is closed
  too). A request being handled is not: an SSE reader or a long-poll keeps its connection for
  as long as it reads (it has its own liveness: heartbeats and the stall timeout);
- keeps ``max_connections`` at most, authenticated or not, and answers any more with a bare
  503 and closes them at once, with a line in the log at most once a minute: the rest of the
  process's open files stay for delivery and the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from pgferry.relay.surface import is_loopback

log = logging.getLogger(__name__)

#: seconds a connection may go without a whole request head, from its start or its last response
IDLE_TIMEOUT = 15.0
#: seconds a request's body may take to arrive, once its head has (a POST that promised a body and
#: sends none held its connection for good)
BODY_TIMEOUT = 30.0
#: seconds between two log lines about refused connections, per server
REFUSAL_LOG_INTERVAL = 60.0

_REFUSAL_TEXT = b"too many connections to this server; try again shortly\n"
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSAL_TEXT), _REFUSAL_TEXT)
)


def is_loopback_name(host: str) -> bool:
    """Whether ``host`` (a request's Host, without its port) is a name a server bound to loopback
    answers to: localhost or a loopback address literal (any of 127.0.0.0/8, ::1). A page of
    another name that reaches it (DNS rebinding) is refused; an address literal cannot be rebound.
    Listed names only refused the server's own --dashboard-host 127.0.0.2 (outside probe)."""
    return is_loopback(host.lower().removeprefix("[").removesuffix("]"))


class _Refusals:
    """Says in the log that a server refuses connections: the first at once, then how many
    more at most every REFUSAL_LOG_INTERVAL seconds (a flood must not flood the log)."""

    def __init__(self, name: str, limit: int, idle_timeout: float) -> None:
        self.name = name
        self.limit = limit
        self.idle_timeout = idle_timeout
        self.unlogged = 0
        self.logged_at: float | None = None

    def refused(self) -> None:
        self.unlogged += 1
        now = time.monotonic()
        if self.logged_at is not None and now - self.logged_at < REFUSAL_LOG_INTERVAL:
            return
        log.warning(
            "%s: refused %d connection(s): it holds %d at most, open or idle, so that the relay keeps "
            "open files for delivery and the database; a connection without a request is closed after "
            "%g s (this line is logged once a minute at most)",
            self.name, self.unlogged, self.limit, self.idle_timeout,
        )  # fmt: skip
        self.unlogged = 0
        self.logged_at = now


class _CappedServer(web.Server):
    """aiohttp's protocol factory, counting its connections and closing those beyond ``limit``
    as soon as they are accepted (the accept itself cannot be declined)."""

    def __init__(self, *args: Any, refusals: _Refusals, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals = refusals
        self.open = 0

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open += 1
        if self.open > self.refusals.limit:
            transport.write(_REFUSAL)
            transport.close()  # once the refusal is written; connection_lost counts it out
            self.refusals.refused()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.open -= 1
        super().connection_lost(handler, exc)


class GuardedRunner(web.AppRunner):
    """An ``AppRunner`` whose connections are bounded in number and in idle time (see the module)."""

    def __init__(
        self,
        app: web.Application,
        *,
        name: str,
        max_connections: int,
        idle_timeout: float = IDLE_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, handle_signals=False, access_log=None, keepalive_timeout=idle_timeout, **kwargs)
        self.refusals = _Refusals(name, max(1, max_connections), idle_timeout)

    @property
    def open_connections(self) -> int:
        return self.server.open if isinstance(self.server, _CappedServer) else 0

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen, as aiohttp does it
        return _CappedServer(
            made.request_handler,
            request_factory=made.request_factory,
            loop=asyncio.get_running_loop(),
            refusals=self.refusals,
            **self._kwargs,
        )
