"""`pgferry apply pgferry.toml`: make the database's webhook subscriptions match a file.

The file names subscriptions under ``[subscriptions.NAME]``. A setting left
out means its default, so deleting a line from the file resets it: the file
is the whole truth about the subscriptions it names. Secrets never appear in
the file: ``secret_env`` names the environment variable(s) holding them, and
``headers_env`` does the same for header values (e.g. Authorization); the
diff only ever says that a secret or header changed, never its value.

Subscriptions an apply created are marked ``managed_by = 'apply'``; when they
leave the file the next apply removes them. Subscriptions made by hand, with
SQL or by pg_net's API are never touched unless the file names them (they are
then adopted) or ``--prune`` is given. The whole change runs in one
transaction: it applies completely or not at all. ``run`` plans and carries
out in that transaction under an advisory lock, so applies at once behave as
if one ran after the other (each planned against what the one before it
committed). Removing a subscription deletes its cursor, parked retries and
dead letters: the plan says how many (``removal_summary``), and ``run`` can be
told to refuse such removals unless allowed (the CLI's ``--yes``).
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from pgferry import sql
from pgferry.delivery.destinations import shown_url
from pgferry.errors import INTERVAL_HINT, PgferryError, one_line
from pgferry.schema import LOCK_CLASS

MANAGED_BY = "apply"
#: objid of apply's advisory lock, classid schema.LOCK_CLASS (install 1, ticker 2, relay presence 3,
#: tick 4, WAL capture 5): taken first in an apply's transaction, released at its end.
APPLY_LOCK = 6

#: settings of ferry.subscribe with their defaults, in display order
DEFAULTS: dict[str, Any] = {
    "batch_size": 1,
    "max_in_flight": 32,
    "ordered": False,
    "timeout_ms": 10000,
    "connect_timeout_ms": 5000,
    "max_attempts": 12,
    "max_age": "3 days",
    "retry_base_ms": 1000,
    "retry_max_ms": 600000,
    "filter": None,  # a jsonpath predicate; None: every event of the streams
    "partitions": 1,  # spread over this many partitions by key hash (migration 0018)
}
#: what credentials_env may name (ferry.set_subscription_credentials)
CREDENTIALS = ("user", "password", "token", "creds_file")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "streams": list, "url": str, "headers": dict, "headers_env": dict, "secret_env": (str, list),
    "credentials_env": dict,
    "from_beginning": bool, "batch_size": int, "max_in_flight": int, "ordered": bool, "timeout_ms": int,
    "connect_timeout_ms": int, "max_attempts": int, "max_age": str, "retry_base_ms": int, "retry_max_ms": int,
    "filter": str, "partitions": int,
}  # fmt: skip


@dataclass
class Desired:
    name: str
    streams: list[str]
    url: str
    headers: dict[str, str]
    secret_headers: set[str]
    secrets: list[str]
    #: a broker's credentials, read from the environment (credentials_env)
    credentials: dict[str, str]
    from_beginning: bool
    settings: dict[str, Any]
    #: the environment variables ``secrets`` came from, in the same order (to name one refused)
    secret_vars: list[str] = field(default_factory=list)


@dataclass
class Change:
    action: str  # create | update | adopt | remove | unchanged
    name: str
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # field -> (old, new), secrets masked
    desired: Desired | None = None
    reason: str = ""
    #: streams of the file's subscription that nothing has written yet (a typo?); applied all the same
    unwritten: list[str] = field(default_factory=list)
    #: what a removal deletes with the subscription (and its cursor): parked retries, dead letters
    parked: int = 0
    dead: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "name": self.name,
            "changes": {k: {"from": old, "to": new} for k, (old, new) in self.fields.items()},
            "reason": self.reason,
            "unwritten_streams": self.unwritten,
            "parked_retries": self.parked,
            "dead_letters": self.dead,
        }


class RemovalsNotAllowed(PgferryError):
    """``run`` was not allowed to remove subscriptions holding parked retries or dead letters:
    nothing was changed. ``changes`` is the plan it refused."""

    def __init__(self, changes: list[Change]) -> None:
        self.changes = changes
        super().__init__(f"the apply would remove {removal_summary(changes)}; nothing was changed")


def removal_summary(changes: list[Change]) -> str:
    """What the plan's removals delete, to follow a verb ("remove ..."): "2 subscription(s) with their
    cursors, 3 parked retry(ies) and 5 dead letter(s)"; "" when it removes none."""
    removed = [c for c in changes if c.action == "remove"]
    if not removed:
        return ""
    parked = sum(c.parked for c in removed)
    dead = sum(c.dead for c in removed)
    return f"{len(removed)} subscription(s) with their cursors, {parked} parked retry(ies) and {dead} dead letter(s)"


def load(path: Path, env: Mapping[str, str] | None = None) -> list[Desired]:
    """Parse and check the file; secrets are read from the environment now, so a missing one fails early."""
    env = os.environ if env is None else env
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PgferryError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8; this was a traceback (outside review)
        raise PgferryError(
            f"{path} is not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); TOML files are UTF-8: "
            "save it as UTF-8"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise PgferryError(f"{path} is not valid TOML: {exc}") from exc
    unknown_top = set(doc) - {"subscriptions"}
    if unknown_top:
        raise PgferryError(
            f"{path}: unknown top-level key(s) {', '.join(sorted(unknown_top))}; expected [subscriptions.NAME]"
        )
    subs = doc.get("subscriptions", {})
    if not isinstance(subs, dict):
        raise PgferryError(f"{path}: 'subscriptions' must be a table of [subscriptions.NAME] tables")
    return [_desired(path, name, spec, env) for name, spec in subs.items()]


def _desired(path: Path, name: str, spec: Any, env: Mapping[str, str]) -> Desired:
    where = f"{path}: [subscriptions.{name}]"
    if not isinstance(spec, dict):
        raise PgferryError(f"{where} must be a table")
    if "secret" in spec or "secrets" in spec:
        raise PgferryError(f"{where}: secrets do not belong in the file; name the environment variable with secret_env")
    unknown = set(spec) - set(_TYPES)
    if unknown:
        raise PgferryError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
    for key, value in spec.items():
        expected = _TYPES[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise PgferryError(f"{where}: {key} has the wrong type ({type(value).__name__})")
        if isinstance(value, int) and not -(2**31) <= value < 2**31:  # ferry.subscribe checks the real bounds
            raise PgferryError(f"{where}: {key} = {value} is out of range")
    for key in ("streams", "url"):
        if key not in spec:
            raise PgferryError(f"{where}: {key} is required")
    if not all(isinstance(s, str) for s in spec["streams"]):
        raise PgferryError(f"{where}: streams must be a list of strings")
    # A header's value is sent as it is written: 1, true, a table or a date were sent as Python's
    # "1", "True", "{'a': 1}" (outside verifier); a variable's name is a string too.
    for table in ("headers", "headers_env", "credentials_env"):
        for key, value in spec.get(table, {}).items():
            if not isinstance(value, str):
                what = "a string" if table == "headers" else "a string, the name of an environment variable"
                raise PgferryError(f"{where}: {table}.{key} must be {what}, not {_kind(value)}")
    headers = dict(spec.get("headers", {}))
    secret_headers = set()
    for header, var in spec.get("headers_env", {}).items():
        headers[header] = _env(env, var, f"{where}: headers_env.{header}")
        secret_headers.add(header)
    names = spec.get("secret_env", [])
    secret_vars = [names] if isinstance(names, str) else names
    for index, var in enumerate(secret_vars):
        if not isinstance(var, str):  # a TypeError in re.fullmatch (outside verifier)
            raise PgferryError(
                f"{where}: secret_env[{index}] must be a string, the name of an environment variable, not {_kind(var)}"
            )
    secrets = [_env(env, var, f"{where}: secret_env {var}") for var in secret_vars]
    credentials = {}
    for key, var in spec.get("credentials_env", {}).items():
        if key not in CREDENTIALS:
            raise PgferryError(f"{where}: credentials_env.{key}: expected one of {', '.join(CREDENTIALS)}")
        credentials[key] = _env(env, var, f"{where}: credentials_env.{key}")
    settings = {key: spec.get(key, default) for key, default in DEFAULTS.items()}
    return Desired(
        name=name,
        # a stream listed twice is one stream, as ferry.subscribe stores it: compared as written, the
        # file never matched the database and every apply rewrote it (outside probe)
        streams=list(dict.fromkeys(spec["streams"])),
        url=spec["url"],
        headers=headers,
        secret_headers=secret_headers,
        secrets=secrets,
        credentials=credentials,
        from_beginning=spec.get("from_beginning", False),
        settings=settings,
        secret_vars=list(secret_vars),
    )


def _kind(value: Any) -> str:
    """A TOML value's type, as the file's author wrote it."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, datetime | date | time):
        return f"the date/time {value.isoformat()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _env(env: Mapping[str, str], var: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise PgferryError(f"{what}: {var!r} is not an environment variable name")
    value = env.get(var)
    if not value:
        raise PgferryError(f"{what}: environment variable {var} is not set")
    return value


async def run(
    conn: asyncpg.Connection,
    desired: list[Desired],
    *,
    prune: bool = False,
    dry_run: bool = False,
    allow_losses: bool | Mapping[str, tuple[int, int]] = True,
) -> list[Change]:
    """Plan and carry out in one transaction that first takes apply's advisory lock: two applies
    at once planned before either wrote, and both "succeeded", leaving a state of neither file
    (outside verifier); now the second waits, then plans against what the first committed.
    ``dry_run``: roll it all back. ``allow_losses``: True, or the subscriptions whose removal may
    delete parked retries or dead letters, each with the (parked, dead) counts an operator agreed
    to lose, which the removal may not exceed (asked about 11 parked retries, an
    operator's yes removed the 55 there were by then: outside probe); another such removal raises
    RemovalsNotAllowed (nothing changed). A dry run is never refused."""
    async with _transaction(conn, dry_run):
        changes = await plan(conn, desired, prune=prune)
        losing = [c for c in changes if c.action == "remove" and (c.parked or c.dead)]
        if not dry_run and not all(_may_lose(c, allow_losses) for c in losing):
            raise RemovalsNotAllowed(changes)
        await _carry_out_all(conn, changes)
    return changes


def _may_lose(change: Change, allowed: bool | Mapping[str, tuple[int, int]]) -> bool:
    if isinstance(allowed, bool):
        return allowed
    agreed = allowed.get(change.name)
    return agreed is not None and change.parked <= agreed[0] and change.dead <= agreed[1]


async def plan(conn: asyncpg.Connection, desired: list[Desired], *, prune: bool = False) -> list[Change]:
    """What applying ``desired`` changes, read from the database; read-only. Inside ``run``'s
    transaction it is what will be done; on its own, a preview that another apply may overtake."""
    current = {r["name"]: dict(r) for r in await conn.fetch(sql.query("subscription_settings"))}
    changes: list[Change] = []
    intervals: dict[str, timedelta] = {}
    for want in desired:  # every max_age, a new subscription's too: refused naming it, with the hint
        text = want.settings["max_age"]
        if text not in intervals:
            intervals[text] = await _interval(conn, want.name, text)
    for want in desired:
        have = current.get(want.name)
        if have is None:
            fields: dict[str, tuple[Any, Any]] = {
                "streams": (None, want.streams),
                "url": (None, shown_url(want.url)),
            }
            if want.headers:
                fields["headers"] = (None, _shown_headers(want))
            if want.secrets:
                fields["secrets"] = (None, f"{len(want.secrets)} from the environment")
            if want.credentials:
                fields["credentials"] = (None, f"{', '.join(want.credentials)} from the environment")
            for key, value in want.settings.items():
                if value != DEFAULTS[key]:
                    fields[key] = (None, value)
            changes.append(Change("create", want.name, fields, want))
            continue
        fields = {}
        if list(have["streams"]) != want.streams:
            fields["streams"] = (list(have["streams"]), want.streams)
        if have["url"] != want.url:
            fields["url"] = (shown_url(have["url"]), shown_url(want.url))
        if dict(have["headers"] or {}) != want.headers:
            old = dict(have["headers"] or {})
            changed = sorted(k for k in set(old) | set(want.headers) if old.get(k) != want.headers.get(k))
            fields["headers"] = (sorted(old), f"{', '.join(changed)} changed")
        if list(have["secrets"] or []) != want.secrets:
            fields["secrets"] = (
                f"{len(have['secrets'] or [])} set",
                f"{len(want.secrets)} from the environment (changed)",
            )
        if dict(have["credentials"] or {}) != want.credentials:
            fields["credentials"] = (
                ", ".join(have["credentials"] or {}) or "none",
                f"{', '.join(want.credentials) or 'none'} from the environment (changed)",
            )
        for key, value in want.settings.items():
            old_value = have[key]
            new_value: Any = value
            if key == "max_age":
                new_value = intervals[value]
                if old_value != new_value:
                    fields[key] = (_human_interval(old_value), value)
                continue
            if old_value != new_value:
                fields[key] = (old_value, new_value)
        if fields:
            changes.append(Change("update", want.name, fields, want))
        elif have["managed_by"] != MANAGED_BY:
            changes.append(Change("adopt", want.name, {}, want, "now managed by apply"))
        else:
            changes.append(Change("unchanged", want.name, {}, want))
    named = {d.name for d in desired}
    for name, have in current.items():
        if name in named:
            continue
        if have["managed_by"] == MANAGED_BY:
            changes.append(Change("remove", name, reason="created by apply, no longer in the file"))
        elif prune:
            changes.append(Change("remove", name, reason="not in the file (--prune)"))
        else:
            changes.append(Change("unchanged", name, reason="not managed by apply; left alone (see --prune)"))
    removed = {c.name: c for c in changes if c.action == "remove"}
    if removed:
        for row in await conn.fetch(sql.query("subscription_losses"), list(removed)):
            change = removed[row["name"]]
            change.parked, change.dead = row["parked"], row["dead"]
            if change.parked or change.dead:
                change.reason += (
                    f"; its {change.parked} parked retry(ies) and {change.dead} dead letter(s) are deleted with it"
                )
    wanted = sorted({stream for want in desired for stream in want.streams})
    unknown = set(await conn.fetchval(sql.query("unknown_streams"), wanted)) if wanted else set()
    for change in changes:
        if change.desired is not None:
            change.unwritten = [stream for stream in change.desired.streams if stream in unknown]
    return changes


async def execute(conn: asyncpg.Connection, changes: list[Change], *, dry_run: bool = False) -> None:
    """Carry out a plan in one transaction; ``dry_run``: roll it back, so that a dry run refuses
    what applying would (every check ferry.subscribe makes), not only what the plan checks.
    A plan made before this transaction may be stale: ``run`` plans inside it."""
    async with _transaction(conn, dry_run):
        await _carry_out_all(conn, changes)


@contextlib.asynccontextmanager
async def _transaction(conn: asyncpg.Connection, dry_run: bool) -> AsyncIterator[None]:
    """A transaction holding apply's lock, committed at the end unless ``dry_run`` (rolled back then;
    a dry run takes the lock too, so it is planned against a finished apply, and writes nothing)."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(sql.query("apply_lock"), LOCK_CLASS, APPLY_LOCK)
        yield
    except BaseException:
        await transaction.rollback()
        raise
    if dry_run:
        await transaction.rollback()
    else:
        await transaction.commit()


async def _carry_out_all(conn: asyncpg.Connection, changes: list[Change]) -> None:
    for change in changes:
        try:
            await _carry_out(conn, change)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate[:2] in ("22", "42", "55"):  # the file's values, names, state
                raise PgferryError(f"[subscriptions.{change.name}]: {one_line(exc)}") from None
            raise


async def _carry_out(conn: asyncpg.Connection, change: Change) -> None:
    want = change.desired
    if change.action == "remove":
        await conn.execute(sql.query("unsubscribe"), change.name)
        return
    if want is None or change.action == "unchanged":
        return
    if change.action in ("create", "update"):
        s = want.settings
        await conn.execute(
            sql.query("subscribe"), want.name, want.streams, want.url, s["batch_size"],
            s["max_in_flight"], s["ordered"], None, orjson.dumps(want.headers).decode(), s["timeout_ms"],
            s["max_attempts"], s["max_age"], s["retry_base_ms"], s["retry_max_ms"],
            s["connect_timeout_ms"], "beginning" if want.from_beginning else "now", s["filter"],
            s["partitions"],
        )  # fmt: skip
        if change.action == "create" or "secrets" in change.fields:
            for var, secret in zip(want.secret_vars, want.secrets, strict=True):
                try:  # ferry.set_subscription_secrets's refusal did not say which variable was wrong
                    await conn.execute(sql.query("check_secret"), secret)
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate != "22023":
                        raise
                    raise PgferryError(f"[subscriptions.{want.name}]: secret_env {var}: {one_line(exc)}") from None
            await conn.execute(sql.query("set_secrets"), want.name, want.secrets)
        if "credentials" in change.fields:
            credentials = orjson.dumps(want.credentials).decode()
            await conn.execute(sql.query("set_credentials"), want.name, credentials)
    await conn.execute(sql.query("set_managed_by"), want.name, MANAGED_BY)


def _shown_headers(want: Desired) -> dict[str, str]:
    return {k: ("(from the environment)" if k in want.secret_headers else "(set)") for k in sorted(want.headers)}


async def _interval(conn: asyncpg.Connection, name: str, text: str) -> timedelta:
    """``text`` as an interval; refused as the CLI's --max-age is (PostgreSQL's "invalid input syntax
    for type interval" alone did not say which key, or what it takes: outside verifier)."""
    try:
        return await conn.fetchval(sql.query("normalize_interval"), text)  # type: ignore[no-any-return]
    except asyncpg.PostgresError as exc:
        if exc.sqlstate[:2] != "22":
            raise
        raise PgferryError(
            f"[subscriptions.{name}]: invalid value for max_age: {one_line(exc)}; {INTERVAL_HINT}"
        ) from None


def _human_interval(value: timedelta) -> str:
    return str(value)
