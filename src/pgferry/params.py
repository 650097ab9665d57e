"""Click parameter types the commands and the benches share: numbers that must be finite, ports.

A leaf: it imports only click, so that ``pgferry.bench`` can use it without loading the CLI package.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf. nan compares false with every bound, so
    FloatRange let it through: `run --tick-interval nan` started a ticker that logged a traceback
    every round, `run --exit-after nan` ended in a ValueError (outside review)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def seconds(minimum: float = 0, *, inclusive: bool = False) -> FiniteFloatRange:
    """A finite duration above ``minimum`` seconds (or at least it, if ``inclusive``). Zero is refused
    by default: no time at all means nothing for these options (a ticker polling without a pause, a
    timeout over before it starts, a relay that stops as it starts)."""
    return FiniteFloatRange(min=minimum, min_open=not inclusive)


#: A TCP port to listen on, 0 for any free one: a larger number wrapped (70000 listened on 4464)
#: and a negative one failed in getaddrinfo (outside review).
PORT = click.IntRange(0, 65535)


#: A value for a PostgreSQL integer setting: the SQL function says which values it takes
#: (ferry.subscribe: "batch_size must be between 1 and 1000"), but one past int4 never reached it:
#: asyncpg refused it as "a value does not fit", naming no option (outside review).
INT4 = click.IntRange(0, 2**31 - 1)
#: The same for a bigint (ids, byte counts).
INT8 = click.IntRange(0, 2**63 - 1)


class Origin(click.ParamType[str]):
    """A browser origin as the ``Origin`` header carries it (``scheme://host[:port]``, no path), or
    ``*``: anything else never matches a request, so `--api-cors-origin 'not a url'` (or a trailing
    slash) was taken and every page stayed refused, silently (outside review)."""

    name = "origin"
    #: any scheme (https, chrome-extension, capacitor, app, ...), a host and maybe a port, no path
    _FORM = re.compile(r"^[a-z][a-z0-9+.-]*://[^\s/?#@]+$")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).lower()  # browsers send scheme and host in lower case; the API compares exactly
        if text != "*" and not self._FORM.match(text):
            self.fail(f"{text!r} is not an origin: scheme://host[:port] with no path, e.g. https://app.example.com "
                      "(or * for any)", param, ctx)  # fmt: skip
        return text
