"""`pgferry install`, `pgferry run` and `pgferry consumers`."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from pgferry import db
from pgferry.cli.common import (
    ByteSize,
    database_url_option,
    json_option,
    print_json,
    require_url,
    run_coroutine,
    setup_logging,
    with_ferry,
)
from pgferry.delivery.addresses import ALLOW_ENV_VAR, STRICT_ENV_VAR, AddressPolicy, parse_networks
from pgferry.embedded import embedded_postgres, free_port
from pgferry.errors import PgferryError
from pgferry.log.ticker import TickerSettings
from pgferry.params import PORT, Origin, seconds
from pgferry.relay.surface import check_dashboard_binding
from pgferry.schema import install_at
from pgferry.streams.settings import ApiSettings

if TYPE_CHECKING:
    from pgferry.relay.process import Relay

log = logging.getLogger("pgferry")

#: `run --processes` above this many per usable core is refused: a typo of 100000 started that many
#: relays, each with a pool of 10 database connections and more (outside probe)
MAX_PROCESSES_PER_CORE = 8


#: Seconds after a first SIGTERM/SIGINT in which another is the same request, not a second one.
SAME_REQUEST_S = 1.0


def _stop_on_signals(stop: asyncio.Event, again: Callable[[], None] | None = None) -> None:
    """SIGTERM/SIGINT set ``stop``; a second one exits at once (or calls ``again``: the supervisor
    passes it on to its children, which then exit at once, and waits for them).

    One that comes within SAME_REQUEST_S of the first is the same request: systemd's default stop
    (KillMode=control-group) signals the supervisor and its children at once, and each child then
    got the supervisor's forward as a second signal and exited without releasing anything; `timeout`
    signals its command and then its process group (outside probe)."""
    loop = asyncio.get_running_loop()
    first: list[float] = []

    def request_stop(signame: str) -> None:
        if stop.is_set() and first and loop.time() - first[0] < SAME_REQUEST_S:
            log.info("%s again within %g s of the first: the same request (still shutting down)", signame,
                     SAME_REQUEST_S)  # fmt: skip
            return
        if stop.is_set():
            if again is not None:
                log.warning("second %s: telling every relay process to exit now", signame)
                again()
                return
            log.warning("second %s: exiting now", signame)
            raise SystemExit(130)
        log.info("%s received: shutting down (again to force)", signame)
        first.append(loop.time())
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop, sig.name)
    # SIGHUP's default ended the supervisor at once (exit 129, nothing logged, nothing released;
    # its children then exited on their own): a closed terminal or an ExecReload= took the whole
    # relay set down hard (outside probe). There is nothing to reload: it is noted and ignored.
    loop.add_signal_handler(
        signal.SIGHUP, lambda: log.info("SIGHUP received: pgferry has nothing to reload; ignored (SIGTERM stops it)")
    )


@click.command()
@database_url_option
@click.option(
    "--pg-net",
    is_flag=True,
    help="Also install the pg_net-compatible API (schema `net`, supabase_functions.http_request).",
)
def install(database_url: str | None, pg_net: bool) -> None:
    """Install or upgrade the ferry schema (safe to run twice or concurrently).

    Also creates, when missing, the NOLOGIN roles ferry_writer (may only append
    events: ferry.publish, captured tables, the net.http_* API) and ferry_relay
    (what `pgferry run` and the operator commands need). The first install in a
    cluster therefore needs CREATEROLE. See docs/security.md.
    """
    applied = run_coroutine(install_at(require_url(database_url), addons=("pg_net",) if pg_net else ()))
    if applied:
        click.echo(f"installed: {', '.join(applied)}")
    else:
        click.echo("no migration to apply; functions and captures are as this version defines them")
    click.echo(
        "roles: ferry_writer (publish, captured tables, net.http_*), ferry_relay (pgferry run); "
        "grant them to login roles, e.g. `grant ferry_writer to app`"
    )


@click.command()
@database_url_option
@click.option(
    "--tick-interval", default=0.01, show_default=True, type=seconds(), help="Seconds between tick checks while busy."
)
@click.option(
    "--idle-poll-interval", default=0.5, show_default=True, type=seconds(), help="Longest wait between tick checks."
)
@click.option("--exit-after", type=seconds(), help="Stop by itself after this many seconds.")
@click.option(
    "--strict-addresses",
    is_flag=True,
    envvar=STRICT_ENV_VAR,
    help=f"Multi-tenant mode: also refuse loopback, private, CGNAT, unspecified and multicast addresses "
    f"(or set {STRICT_ENV_VAR}=1).",
)
@click.option(
    "--allow-address",
    "allow_addresses",
    multiple=True,
    metavar="CIDR",
    envvar=ALLOW_ENV_VAR,
    help=f"Allow this address range although refused otherwise (repeatable; or {ALLOW_ENV_VAR}=cidr,...).",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="PGFERRY_CA_FILE",
    help="PEM file of CA certificates to trust for https endpoints, in addition to the system's "
    "(or set PGFERRY_CA_FILE; SSL_CERT_FILE replaces the system's instead).",
)
@click.option(
    "--log-format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    envvar="PGFERRY_LOG_FORMAT",
    help="Log lines for people, or one JSON object per line for log collectors. Secrets are never logged.",
)
@click.option("--metrics-port", type=PORT, metavar="PORT", help="Serve Prometheus metrics on this port (0: any free).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics server binds to.")
@click.option(
    "--metrics-histograms",
    type=click.Choice(["subscription", "relay"]),
    default="subscription",
    show_default=True,
    help="Latency, lag and batch histograms per subscription (~50 series each), or one set for the relay "
    "(thousands of subscriptions).",
)
@click.option("--dashboard-port", type=PORT, metavar="PORT", help="Serve the web dashboard on this port (0: any free).")
@click.option("--dashboard-host", default="127.0.0.1", show_default=True, help="Address the dashboard binds to.")
@click.option(
    "--dashboard-token",
    envvar="PGFERRY_DASHBOARD_TOKEN",
    help="Token the dashboard asks for (required when it binds to a non-loopback address).",
)
@click.option(
    "--api-port",
    type=PORT,
    metavar="PORT",
    help="Serve the streams HTTP API (SSE, long-poll, publish) on this port (0: any free).",
)
@click.option("--api-host", default="127.0.0.1", show_default=True, help="Address the streams API binds to.")
@click.option(
    "--api-cors-origin",
    multiple=True,
    type=Origin(),
    metavar="ORIGIN",
    help="Let browser pages from this origin call the streams API, e.g. https://app.example.com "
    "(repeatable; * for any).",
)
@click.option(
    "--api-allow-loopback",
    is_flag=True,
    help="Serve requests from loopback addresses without an API token (never behind a proxy on this host).",
)
@click.option(
    "--processes",
    type=int,
    envvar="PGFERRY_PROCESSES",
    metavar="N",
    help="Relay processes to run under one supervisor (or set PGFERRY_PROCESSES) [default: the usable cores; "
    "1 for the demo]. 1 runs the relay in this process, with no supervisor.",
)
@click.option(
    "--db-command-timeout",
    default=db.Liveness.command_timeout,
    show_default=True,
    type=seconds(0.1, inclusive=True),
    help="Seconds a relay statement may wait for its answer before the connection is dropped and remade.",
)
@click.option(
    "--db-session-timeout",
    default=db.Liveness.session_timeout,
    show_default=True,
    type=seconds(1, inclusive=True),
    help="Seconds after which PostgreSQL ends a silent lock-holding relay session (frees a cut-off relay's locks).",
)
@click.option(
    "--max-batch-bytes",
    type=ByteSize(),
    default="16MB",
    show_default=True,
    help="Bytes of events a subscription holds in memory at once (its batches read ahead and its retries; "
    "an event larger than this still goes, alone). Suffixes KB, MB, GB (powers of 1024).",
)
@click.option(
    "--max-read-bytes",
    type=ByteSize(),
    default="64MB",
    show_default=True,
    help="Bytes of events all subscriptions of a relay process hold in memory at once, together (reads wait "
    "for room; one event larger than this still goes, alone). Suffixes KB, MB, GB.",
)
@click.pass_context
def run(
    ctx: click.Context,
    database_url: str | None,
    tick_interval: float,
    idle_poll_interval: float,
    exit_after: float | None,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    metrics_histograms: str,
    dashboard_port: int | None,
    dashboard_host: str,
    dashboard_token: str | None,
    api_port: int | None,
    api_host: str,
    api_cors_origin: tuple[str, ...],
    api_allow_loopback: bool,
    strict_addresses: bool,
    allow_addresses: tuple[str, ...],
    ca_file: str | None,
    processes: int | None,
    db_command_timeout: float,
    db_session_timeout: float,
    max_batch_bytes: int,
    max_read_bytes: int,
) -> None:
    """Run the relay. Without a database URL: a throwaway PostgreSQL and a demo."""
    # The relay (delivery, HTTP client, ownership) is loaded by the one command that runs it.
    from pgferry.relay.process import Relay, RelaySettings
    from pgferry.relay.supervisor import Supervisor, SupervisorSettings, usable_cores

    verbose = bool(ctx.find_root().params.get("verbose"))
    setup_logging(verbose, log_format)
    if processes is not None and processes < 1:
        raise click.BadParameter(f"must be at least 1 (got {processes})", param_hint="--processes")
    if processes is not None and processes > (most := MAX_PROCESSES_PER_CORE * usable_cores()):
        raise click.BadParameter(
            f"{processes} is more than {MAX_PROCESSES_PER_CORE} per usable core ({most} here): each process "
            "holds its own database connections and they would only contend; run more relays on other hosts",
            param_hint="--processes",
        )
    try:
        policy = AddressPolicy(strict=strict_addresses, allow=parse_networks(allow_addresses))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--allow-address") from exc
    try:
        settings = RelaySettings(
            ticker=TickerSettings(busy_interval=tick_interval, idle_interval=idle_poll_interval),
            liveness=db.Liveness(command_timeout=db_command_timeout, session_timeout=db_session_timeout),
            addresses=policy,
            ca_file=ca_file,
            max_batch_bytes=max_batch_bytes,
            max_read_bytes=max_read_bytes,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            metrics_subscription_histograms=metrics_histograms == "subscription",
            dashboard_port=dashboard_port,
            dashboard_host=dashboard_host,
            dashboard_token=dashboard_token,
            api=None
            if api_port is None
            else ApiSettings(
                port=api_port, host=api_host, cors_origins=api_cors_origin, allow_loopback=api_allow_loopback
            ),
        )
    except (ValueError, PgferryError) as exc:
        raise click.BadParameter(str(exc)) from exc
    if dashboard_port is not None:
        try:
            check_dashboard_binding(dashboard_host, dashboard_token)
        except PgferryError as exc:
            raise click.UsageError(str(exc)) from exc

    async def go(url: str, demo: bool, page_port: int | None = None) -> None:
        relay = Relay(url, settings)
        extra = None
        if demo:
            from pgferry.demo import run_demo

            def extra(stop: asyncio.Event) -> Coroutine[Any, Any, None]:
                return run_demo(url, stop, page_port=page_port, api_url=lambda: relay.addresses.get("api"))

        await _run_relay(relay, exit_after, extra)

    async def supervise(url: str, how_many: int) -> None:
        stop = asyncio.Event()
        supervisor = Supervisor(
            url,
            settings,
            SupervisorSettings(processes=how_many),
            child_command=[
                sys.executable, "-m", "pgferry", *(["-v"] if verbose else []), "run-child", "--log-format", log_format,
            ],
        )  # fmt: skip
        _stop_on_signals(stop, again=lambda: supervisor.forward(signal.SIGTERM))
        if exit_after is not None:
            asyncio.get_running_loop().call_later(exit_after, stop.set)
        await supervisor.run(stop)

    if database_url is None and os.environ.get("PGFERRY_DATABASE_URL") is not None:
        database_url = os.environ["PGFERRY_DATABASE_URL"]  # click reads an empty variable as unset
    if database_url is not None and not database_url.strip():
        # Set but empty (a service's URL variable injected empty): a throwaway demo database would
        # run "healthy" in its place (outside probe). Every other command refuses it too.
        raise click.UsageError("--database-url (or PGFERRY_DATABASE_URL) is empty: give the database's URL, or unset "
                               "both to run the demo on a throwaway PostgreSQL")  # fmt: skip
    if database_url:
        # The demo below runs in this process beside its relay; a relay of a database given
        # by URL runs on every usable core unless told otherwise (docs/operations.md).
        how_many = processes if processes is not None else usable_cores()
        if how_many == 1:
            run_coroutine(go(database_url, demo=False), relay=True, url=database_url)
        else:
            run_coroutine(supervise(database_url, how_many), relay=True, url=database_url)
        return
    if processes is not None and processes != 1:
        raise click.UsageError("the demo (no --database-url) runs one relay process; give --database-url "
                               "to run several")  # fmt: skip

    click.echo("no --database-url given: starting a throwaway PostgreSQL for a demo ...")
    # The demo shows its streams in a browser: the API serves the demo page's origin, and
    # loopback without tokens (a throwaway database on this machine only).
    page_port = free_port()
    api = settings.api or ApiSettings(host=api_host)
    settings.api = replace(api, allow_loopback=True, cors_origins=(*api.cors_origins, f"http://127.0.0.1:{page_port}"))
    try:
        with embedded_postgres() as pg:
            click.echo(f"PostgreSQL is up at {pg.url} (removed on exit); try: psql {pg.url}")
            run_coroutine(install_at(pg.url))
            run_coroutine(go(pg.url, demo=True, page_port=page_port), relay=True)
    except PgferryError as exc:
        raise click.ClickException(str(exc)) from exc


async def _run_relay(
    relay: Relay, exit_after: float | None, extra: Callable[[asyncio.Event], Coroutine[Any, Any, None]] | None = None
) -> None:
    """Run one relay in this process until SIGTERM/SIGINT (or ``exit_after``), with ``extra`` beside it."""
    # Long-lived objects made at startup never need collecting; freezing them
    # and collecting less often trims GC pauses from delivery latency.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    if exit_after is not None:
        asyncio.get_running_loop().call_later(exit_after, stop.set)
    tasks = [asyncio.create_task(relay.run(stop))]
    if extra is not None:
        tasks.append(asyncio.create_task(extra(stop)))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@click.command("run-child", hidden=True)
@click.option("--log-format", type=click.Choice(["human", "json"]), default="human")
@click.pass_context
def run_child(ctx: click.Context, log_format: str) -> None:
    """One relay process of `pgferry run --processes N`, started by its supervisor (not by hand):
    its settings come as a pickle on stdin, and the end of stdin means the supervisor is gone."""
    from pgferry.relay.supervisor import child_relay, read_order

    order = read_order(sys.stdin.buffer)
    setup_logging(bool(ctx.find_root().params.get("verbose")), log_format, process=str(order.slot))
    run_coroutine(_run_relay(child_relay(order), exit_after=None), relay=True)


@click.command()
@database_url_option
@json_option
def consumers(database_url: str | None, as_json: bool) -> None:
    """List consumers and their positions."""
    rows = with_ferry(database_url, lambda f: f.consumers())
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no consumers")
    for row in rows:
        streams = ",".join(row["streams"]) if row["streams"] else "*"
        pending = f" batch {row['batch_id']} open" if row["batch_id"] else ""
        click.echo(
            f"{row['name']:<24} streams={streams:<30} tick={row['tick_id']:<8} "
            f"lag~{row['approx_lag_events']} events{pending}"
        )
