"""`pgferry bench ...`: the group; its subcommands live with the benchmarks (pgferry.bench.cli)."""

from __future__ import annotations

import click

from pgferry.bench.cli import register


@click.group()
def bench() -> None:
    """Benchmarks (a throwaway durable PostgreSQL unless --database-url is given)."""


register(bench)
