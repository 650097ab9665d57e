"""Fixtures for operator tests: the delivery tests' relay and receivers, and the CLI in a subprocess."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pgferry.receiver import Receiver
from tests.delivery.conftest import relay
from tests.helpers import cli

__all__ = ["MakeReceiver", "cli", "relay"]

MakeReceiver = Callable[..., Awaitable[tuple[Receiver, str]]]
