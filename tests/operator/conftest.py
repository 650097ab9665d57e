"""Operator tests' shared names: the CLI in a subprocess and the receiver factory's type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pgferry.receiver import Receiver
from tests.helpers import cli

__all__ = ["MakeReceiver", "cli"]

MakeReceiver = Callable[..., Awaitable[tuple[Receiver, str]]]
