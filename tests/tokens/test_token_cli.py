"""`pgferry token create | list | revoke` as real subprocesses against a real PostgreSQL."""

from __future__ import annotations

import hashlib
import re

import asyncpg
import orjson

from pgferry import api_tokens
from pgferry.api_tokens import TokenStore
from tests.helpers import cli


async def test_create_prints_the_token_once_list_never_shows_it_and_revoke_ends_it(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    made = await cli(pgferry_cmd, db_url, "token", "create", "billing-reader", "--read", "billing.*", "--read", "audit")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert made.stdout == token + "\n" and re.fullmatch(r"pft_[A-Za-z0-9_-]{43}", token)
    assert made.stderr == (
        "token billing-reader created; it is shown only this once and cannot be shown again: store it now\n"
    )
    writer = await cli(pgferry_cmd, db_url, "token", "create", "publisher", "--write", "*")
    assert writer.returncode == 0, writer.stderr

    hash_hex = hashlib.sha256(token.encode()).hexdigest()
    listed = await cli(pgferry_cmd, db_url, "token", "list")
    as_json = await cli(pgferry_cmd, db_url, "token", "list", "--json")
    for out in (listed, as_json):
        assert out.returncode == 0, out.stderr
        assert token not in out.stdout and token.removeprefix("pft_") not in out.stdout
        assert hash_hex not in out.stdout.lower() and "\\x" not in out.stdout
    assert re.search(r"^billing-reader +billing\.\*,audit +- ", listed.stdout, re.M), listed.stdout
    rows = orjson.loads(as_json.stdout)
    assert [(r["name"], r["read_patterns"], r["write_patterns"]) for r in rows] == [
        ("billing-reader", ["billing.*", "audit"], []),
        ("publisher", [], ["*"]),
    ]
    assert rows[0]["last_used_at"] is None and rows[0]["revoked_at"] is None and rows[0]["created_by"] == "postgres"

    store = TokenStore(conn)
    assert (await store.authorize(token, "billing.eu", "read")).allowed
    assert (await store.authorize(token, "billing.eu", "write")).status == 403

    revoked = await cli(pgferry_cmd, db_url, "token", "revoke", "billing-reader")
    assert (revoked.returncode, revoked.stdout) == (0, "token billing-reader revoked\n")
    assert await store.refresh() == 1
    assert (await store.authorize(token, "billing.eu", "read")).status == 401
    live = orjson.loads((await cli(pgferry_cmd, db_url, "token", "list", "--json")).stdout)
    assert [r["name"] for r in live] == ["publisher"]
    everything = orjson.loads((await cli(pgferry_cmd, db_url, "token", "list", "--all", "--json")).stdout)
    assert [(r["name"], r["revoked_at"] is not None) for r in everything] == [
        ("billing-reader", True), ("publisher", False),
    ]  # fmt: skip

    # the name of a revoked token is free for its replacement
    again = await cli(pgferry_cmd, db_url, "token", "create", "billing-reader", "--read", "billing.*")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() != token
    assert await conn.fetchval("select count(*) from ferry.api_tokens where name = 'billing-reader'") == 2


async def test_token_commands_say_what_is_wrong_in_one_line(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection
) -> None:
    await api_tokens.create(conn, "taken", ["*"], [])
    cases = {
        ("create", "taken", "--read", "x"): "Error: pgferry: a token named 'taken' already exists. "
        "Revoke it first (pgferry token revoke), or choose another name.",
        ("create", "t", "--read", ""): "Error: read pattern #1 is empty; a pattern is a stream name with * for any "
        "run of characters and ? for one (* alone is every stream)",
        ("create", "t", "--read", "ok", "--write", "a\nb"): "Error: write pattern #1 ('a\\nb') holds a control "
        "character (a line break, a tab, ...)",
        ("create", "t", "--write", "x" * 201): "Error: write pattern #1 ('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'...)"
        " is 201 characters long; the limit is 200",
        ("create", "bad name", "--read", "x"): "Error: pgferry: token name 'bad name' must be 1-100 letters, digits, "
        "_ . : or -",
        ("revoke", "nobody"): "Error: pgferry: no token named 'nobody' (or it is revoked already). "
        "See `pgferry token list`.",
    }
    for args, expected in cases.items():
        done = await cli(pgferry_cmd, db_url, "token", *args)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", expected + "\n"), args
    nothing = await cli(pgferry_cmd, db_url, "token", "create", "t")
    assert nothing.returncode == 2
    assert "give at least one --read or --write PATTERN" in nothing.stderr
    assert await conn.fetchval("select count(*) from ferry.api_tokens") == 1
