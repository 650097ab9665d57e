"""Operator tests' shared names: the CLI in a subprocess and the receiver factory's type."""

from __future__ import annotations

from tests.helpers import MakeReceiver, cli

__all__ = ["MakeReceiver", "cli"]
