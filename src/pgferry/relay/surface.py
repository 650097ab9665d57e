"""What the relay shares with its operator side (metrics, dashboard): a leaf of plain types.

The relay starts the operator web servers (``ops/web.py``) through
``OperatorSurface`` and hands them a ``RelayView``: the few things they read
(their ports, whether this relay ticks, its requests in flight) and the one
thing they write (where they listen). The metrics hooks the relay calls while
it works come back as ``RelayHooks``. So ``ops/`` depends on this module, never
on ``relay/process.py``, and nothing under ``relay/`` imports ``ops/``
(``tests/test_layout.py``). The relay runs without the operator side
importable unless a metrics or dashboard port asks for it.

Imports nothing from pgferry at run time but ``errors``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pgferry.errors import PgferryError

if TYPE_CHECKING:
    from pgferry.delivery.context import Outcome


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_dashboard_binding(host: str, token: str | None) -> None:
    """The dashboard can pause, resume and replay: off loopback it must not be open to anyone."""
    if not is_loopback(host) and not token:
        raise PgferryError(
            f"the dashboard would listen on {host}, which is not loopback: give --dashboard-token "
            "(or PGFERRY_DASHBOARD_TOKEN) so that only holders of the token can use it"
        )


@dataclass(frozen=True, slots=True)
class WebSettings:
    """Where the operator web servers listen (``RelaySettings`` fields of the same names)."""

    #: Prometheus metrics at http://metrics_host:metrics_port/metrics (None: off; 0: any free port)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: histograms per subscription (False: one set for the relay)
    metrics_subscription_histograms: bool = True
    #: the web dashboard (None: off; 0: any free port); a token is required off loopback
    dashboard_port: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = field(default=None, repr=False)

    @property
    def wanted(self) -> bool:
        return self.metrics_port is not None or self.dashboard_port is not None


@dataclass(frozen=True, slots=True)
class RelayView:
    """The relay as its operator web servers see it."""

    url: str
    web: WebSettings
    #: does this relay run the ticker now?
    is_ticker: Callable[[], bool]
    #: requests in flight per subscription this relay delivers
    in_flight: Callable[[], dict[str, int]]
    #: tell the relay where a server listens: ("metrics" or "dashboard", its URL)
    announce: Callable[[str, str], None]
    #: the streams API's counts (readers, followed streams, clients let go...); empty when not served
    streams: Callable[[], dict[str, float]] = dict


@dataclass(frozen=True, slots=True)
class SupervisorView:
    """The supervisor of `pgferry run --processes N` as its operator web servers see it: they serve
    the dashboard and gather the children's metrics into one /metrics."""

    url: str
    web: WebSettings
    #: where each running child serves its metrics (slot -> URL on loopback)
    children: Callable[[], dict[str, str]]
    #: processes (asked for), running, restarts (since start)
    counts: Callable[[], dict[str, float]]
    #: tell the supervisor where a server listens: ("metrics" or "dashboard", its URL)
    announce: Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class RelayHooks:
    """Metrics hooks the relay calls as it works; None costs nothing (metrics not served)."""

    #: (seconds the tick took, whether a tick was made)
    observe_tick: Callable[[float, bool], None] | None = None
    #: events WAL capture appended in one step
    observe_wal: Callable[[int], None] | None = None
    #: (subscription, outcomes, from a log batch?) after each delivery round
    observe_outcomes: Callable[[str, Sequence[Outcome], bool], None] | None = None
    #: seconds an ownership round took
    observe_round: Callable[[float], None] | None = None
    #: (subscription, requests) taken back before the wire (``DeliveryContext.observe_withdrawn``)
    observe_withdrawn: Callable[[str, int], None] | None = None


class OperatorSurface(Protocol):
    """The operator side of one relay run, as the relay drives it."""

    @property
    def hooks(self) -> RelayHooks: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


#: makes the operator side of a relay run (``ops.web.OperatorWeb``)
OperatorFactory = Callable[[RelayView], OperatorSurface]
