"""`pgferry bench scale`: one hot subscription across partitions, relay processes and relays.

The seed's scenarios (`pgferry bench webhooks`) with the subscription split
into partitions and delivered by several relay processes (`pgferry run
--processes N`) or several relays (separate `pgferry run` commands), one
layout after the other in one run, so that the ratios hold however fast the
machine is that day. The score that matters: delivered events/s against the
insert rate of the same run, and how long after the last commit the last
event arrived.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from pgferry.bench.report import ms, num
from pgferry.bench.webhooks import Deployment, Outcome, prepare, run_scenario, scenarios


def parse_layouts(text: str) -> tuple[Deployment, ...]:
    """'1,2,4,2r' -> 1, 2 and 4 processes of one relay, then 2 relays of one process; each with one
    partition per process (PxR: P processes in each of R relays)."""
    layouts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        processes, _, relays = item.lower().partition("x")
        if item.lower().endswith("r") and not relays:
            processes, relays = "1", item[:-1]
        try:
            p, r = int(processes), int(relays or 1)
        except ValueError:
            raise click.BadParameter(
                f"{item!r} is not N (processes), NxM (N processes in M relays) or Mr (M relays)"
            ) from None
        if not (1 <= p <= 64 and 1 <= r <= 16):
            raise click.BadParameter(f"{item!r}: 1-64 processes in 1-16 relays")
        layouts.append(Deployment(partitions=p * r, processes=p, relays=r))
    if not layouts:
        raise click.BadParameter("name at least one layout, e.g. 1,2,4")
    return tuple(layouts)


async def run_scale_bench(
    url: str,
    scenario_numbers: Sequence[int],
    layouts: Sequence[Deployment],
    scale: float,
    timeout: float,
    rate: float | None = None,
    backlog: bool = False,
) -> list[tuple[Deployment, Outcome]]:
    await prepare(url)
    every = scenarios(scale)
    results = []
    for number in scenario_numbers:
        for layout in layouts:
            click.echo(f"scenario {number}, {layout.name} ...", err=True)
            results.append((layout, await run_scenario(url, every[number - 1], timeout, rate, layout, backlog)))
    return results


def print_table(results: Sequence[tuple[Deployment, Outcome]]) -> None:
    header = (
        f"{'scenario':<28} {'layout':<40} {'rows':>9} {'insert/s':>9} {'ev/s':>9} {'ratio':>6}"
        f" {'p50 ms':>7} {'p99 ms':>7} {'last+s':>7} {'lost':>5} {'dups':>5}"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for layout, o in results:
        insert_rate = o.inserted / max(1e-9, o.insert_seconds)
        click.echo(
            f"{o.scenario.name[:28]:<28} {layout.name:<40} {num(o.inserted):>9} {num(insert_rate):>9}"
            f" {num(o.throughput):>9} {o.throughput / insert_rate:>6.2f} {ms(o.latency.p50):>7} {ms(o.latency.p99):>7}"
            f" {o.last_after_commit_s:>7.2f} {o.inserted - o.unique:>5} {o.duplicates:>5}"
        )
    click.echo(
        "insert/s: rows pgbench inserted per second; ev/s: events received / (last receipt - first insert); "
        "ratio: ev/s / insert/s (1.00: delivery kept up); p50/p99: commit-to-receipt; last+s: last receipt "
        "after the last commit; lost: inserted, never received; dups: received more than once."
    )
