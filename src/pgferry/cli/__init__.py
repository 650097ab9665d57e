"""The `pgferry` command: the root group, with every command group attached.

One module per command group, all over one shared leaf of helpers:

- ``common``: the database-url option, running a coroutine, a Ferry per command, tables and JSON;
- ``core``: ``install``, ``run``, ``run-child``, ``consumers``;
- ``capture``: ``capture TABLE`` (trigger or WAL capture, and ``--remove``);
- ``backfill``: ``backfill ...`` (the progress-bar loop is ``pgferry.ops.backfill.drive``);
- ``webhooks``: ``subscription ...``;
- ``dlq``: ``dlq ...``;
- ``operator``: ``status``, ``relays``, ``trace``, ``tail``, ``replay``, ``apply``, ``retention``;
- ``tokens``: ``token ...`` (the streams HTTP API's bearer tokens);
- ``bench``: ``bench ...`` (its subcommands are in pgferry.bench.cli).

Modules import ``common`` and nothing else of this package; only this one imports them all.
"""

from __future__ import annotations

import click

from pgferry.cli import backfill, capture, core, dlq, operator, tokens, webhooks
from pgferry.cli.bench import bench
from pgferry.cli.common import setup_logging


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="pgferry")
def main(verbose: bool) -> None:
    """pgferry: events out of PostgreSQL, reliably and in real time."""
    setup_logging(verbose)


for command in (
    core.install,
    core.run,
    core.run_child,
    core.consumers,
    capture.capture,
    backfill.backfill,
    webhooks.subscription,
    dlq.dlq,
    operator.status,
    operator.relays,
    operator.trace,
    operator.tail,
    operator.replay,
    operator.apply,
    operator.retention,
    tokens.token,
    bench,
):
    main.add_command(command)

__all__ = ["main"]
