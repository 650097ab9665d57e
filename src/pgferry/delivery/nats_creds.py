"""A NATS subscription's ``creds_file``, read and checked by pgferry before nats-py sees it.

nats-py reads a credentials file on the event loop while it connects, and
its reader loops forever at the end of a file without a ``BEGIN NATS USER
JWT`` line: one subscription with a seed-only file froze the whole relay,
and each relay that took the subscription over froze too (outside probe).
A seed that is not one came out of nats-py as ``ErrInvalidSeed()``, an
internal error. So the relay reads the file itself, off the event loop and
in bounded time, checks both parts, and hands nats-py the checked text
(never the path: a file changed in between could hang it again):

- a JWT block and a user nkey seed block (an ``nsc`` ``.creds`` file): JWT
  authentication;
- only a user nkey seed, as a block or a bare ``SU...`` line (``nk -gen
  user``): nkey authentication, the server knowing the user's public key;
- anything else: a ``config`` error naming the file and what it lacks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

#: Bytes of a credentials file read at most (an nsc file is ~1 KB).
MAX_BYTES = 1 << 16
#: Seconds the file may take to be read (a hung network filesystem must not hold the connect).
READ_TIMEOUT_S = 2.0

_JWT_BEGIN = "BEGIN NATS USER JWT"
_SEED_BEGIN = "BEGIN USER NKEY SEED"


class BadCredentials(Exception):
    """The file cannot serve as credentials: the message names it and says why."""


async def connect_options(path: str) -> dict[str, Any]:
    """nats.connect's options for the credentials in ``path``; BadCredentials when there are none."""
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            data = await asyncio.to_thread(_read, path)
    except TimeoutError:
        raise BadCredentials(f"the NATS credentials file {path!r} took over {READ_TIMEOUT_S:g} s to read") from None
    except OSError:  # it was "internal" (nkeys missing), or "connect"
        raise BadCredentials(f"cannot read the NATS credentials file {path!r} on this relay's host") from None
    return options_for(path, data)


def _read(path: str) -> bytes:
    with Path(path).open("rb") as f:
        return f.read(MAX_BYTES + 1)


def options_for(path: str, data: bytes) -> dict[str, Any]:
    """The options for a file's content (see the module's docstring)."""
    from nats.aio.client import RawCredentials  # noqa: PLC0415 - loaded by relays that publish to NATS only

    if len(data) > MAX_BYTES:
        raise BadCredentials(f"the NATS credentials file {path!r} is over {MAX_BYTES} bytes: not a credentials file")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise BadCredentials(f"the NATS credentials file {path!r} is not text") from None
    lines = [line.strip() for line in text.splitlines()]
    jwt = _after(lines, _JWT_BEGIN)
    seed = _after(lines, _SEED_BEGIN)
    if seed is None and jwt is None:
        bare = [line for line in lines if line and not line.startswith("#")]
        seed = bare[0] if len(bare) == 1 and bare[0].startswith("SU") else None  # a seed alone (nk -gen user)
    if seed is None:
        what = (
            "a JWT block but no user nkey seed" if jwt is not None else "neither a NATS user JWT nor a user nkey seed"
        )
        raise BadCredentials(
            f"the NATS credentials file {path!r} holds {what} (expected an nsc .creds file with "
            f"'-----{_JWT_BEGIN}-----' and '-----{_SEED_BEGIN}-----' blocks, or a user nkey seed SU...)"
        )
    _check_seed(path, seed)
    if jwt is None:
        return {"nkeys_seed_str": seed}
    if not jwt or jwt.startswith("-"):
        raise BadCredentials(f"the NATS credentials file {path!r} has an empty '{_JWT_BEGIN}' block")
    # nats-py's own reader, on text that has both blocks: it finds them.
    checked = f"-----{_JWT_BEGIN}-----\n{jwt}\n------END NATS USER JWT------\n\n-----{_SEED_BEGIN}-----\n{seed}\n"
    return {"user_credentials": RawCredentials(checked + "------END USER NKEY SEED------\n")}


def _after(lines: list[str], begin: str) -> str | None:
    """The line after the one holding ``begin`` ("" when there is none), or None without one."""
    for i, line in enumerate(lines):
        if begin in line:
            return lines[i + 1] if i + 1 < len(lines) else ""
    return None


def _check_seed(path: str, seed: str) -> None:
    import nkeys  # type: ignore[import-untyped]  # noqa: PLC0415

    try:
        nkeys.from_seed(bytearray(seed.encode())).wipe()
    except Exception:  # noqa: BLE001 - nkeys raises its own classes, and binascii's, for a bad seed
        raise BadCredentials(f"the NATS credentials file {path!r} holds no valid user nkey seed") from None
    if not seed.startswith("SU"):
        kind = seed[:2]
        raise BadCredentials(f"the NATS credentials file {path!r} holds a {kind}... nkey seed, not a user's (SU...)")
