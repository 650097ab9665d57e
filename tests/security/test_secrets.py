"""Signing secrets never leave the database except as signatures.

Searched for: the relay's own output (`pgferry -v run` as a subprocess, and
in-process at DEBUG), every operator command with and without --json, error
messages of bad subscribe calls (Python API, CLI, and PostgreSQL's own server
log), and every text column the relay writes (attempts, retries, dead letters,
relays, net._http_response).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import asyncpg
import pytest

import pgferry
from pgferry.delivery.model import Subscription
from pgferry.delivery.signing import new_secret, redact_secrets
from pgferry.embedded import EmbeddedPostgres
from pgferry.receiver import Received, Respond
from tests.helpers import MakeReceiver, RunningRelay, cli, eventually


def echo_everything(request: Received) -> Respond:
    """A receiver that fails and echoes the whole request back (stored as the attempt's response)."""
    head = "".join(f"{k}: {v}\n" for k, v in request.headers.items())
    return Respond(500, head.encode() + request.body)


async def stored_text(conn: asyncpg.Connection) -> str:
    """Every row the relay writes, as text."""
    parts = []
    for table in (
        "ferry.attempts",
        "ferry.deliveries",
        "ferry.retries",
        "ferry.dead_letters",
        "ferry.relays",
        "ferry.consumers",
    ):
        parts += [r[0] for r in await conn.fetch(f"select t::text from {table} t")]
    return "\n".join(parts)


async def setup_subscriptions(ferry: pgferry.Ferry, conn: asyncpg.Connection, failing: str, ok: str) -> tuple[str, str]:
    secret, rotated = new_secret(), new_secret()
    await ferry.subscribe("failing", ["s"], failing, secret=secret, max_attempts=2, retry_base_ms=10, retry_max_ms=20)
    await ferry.subscribe("ok", ["s"], ok, secret=secret)
    await conn.execute("select ferry.set_subscription_secrets('ok', array[$1, $2])", secret, rotated)
    return secret, rotated


async def test_secrets_stay_out_of_errors_and_cli_output(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection, pg: EmbeddedPostgres
) -> None:
    secret = new_secret()
    # Bad values that only a table CHECK caught used to put the whole row, secret included, in the error DETAIL.
    bad_calls = {"max_attempts": 5000, "retry_base_ms": -1, "retry_max_ms": -5}
    for option, value in bad_calls.items():
        with pytest.raises(pgferry.PgferryError) as caught:
            await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x", secret=secret, **{option: value})  # type: ignore[arg-type]
        texts = [str(caught.value), repr(caught.value), str(caught.value.__cause__), str(caught.value.__context__)]
        assert secret not in "\n".join(texts) and option in str(caught.value)
    add = [*pgferry_cmd, "subscription", "add", "hook", "--url", "http://127.0.0.1:9/x", "--stream", "s"]
    bad = await cli(add, db_url, "--secret", secret, "--retry-base-ms", "5", "--retry-max-ms", "1")
    assert bad.returncode == 1 and "retry_base_ms (5) is larger than retry_max_ms (1)" in bad.stderr, bad.stderr
    assert secret not in bad.stdout + bad.stderr
    bad = await cli(add, db_url, "--secret", secret, "--max-attempts", "5000")  # refused by the option's range
    assert bad.returncode == 2 and "1<=x<=1000" in bad.stderr and secret not in bad.stdout + bad.stderr
    # a secret read from stdin stays out of the process list
    good = await cli(add, db_url, "--secret", "-", stdin=secret + "\n")
    assert good.returncode == 0, good.stderr
    assert await conn.fetchval("select secrets from ferry.subscriptions where name = 'hook'") == [secret]
    with pytest.raises(pgferry.PgferryError, match="signing secrets must look like") as caught:
        await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x", secret=secret[:-4] + "!!!!")
    assert secret[:-4] not in str(caught.value)

    for command in (["status"], ["status", "--json"], ["subscription", "list"], ["subscription", "list", "--json"],
                    ["dlq", "list"], ["dlq", "list", "--json"], ["consumers"]):  # fmt: skip
        shown = await cli(pgferry_cmd, db_url, *command)
        assert shown.returncode == 0, (command, shown.stderr)
        assert secret not in shown.stdout + shown.stderr and "whsec_" not in shown.stdout, command
    # PostgreSQL's own log of the failed statements
    assert secret not in pg.log_file.read_text(errors="replace")


async def test_relay_output_and_records_never_hold_a_secret(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    failing, failing_url = await receiver_factory(echo_everything)
    ok, ok_url = await receiver_factory()
    secret, rotated = await setup_subscriptions(ferry, conn, failing_url, ok_url)
    # a secret that passes the table's format check but is not valid base64 (set behind subscribe's back)
    await ferry.subscribe("broken", ["s"], ok_url)
    broken = "whsec_" + secret[6:11]
    await conn.execute("update ferry.subscriptions set secrets = array[$1] where name = 'broken'", broken)
    relay = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "-v", "run", "--exit-after", "30",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PGFERRY_DATABASE_URL": db_url},
    )  # fmt: skip
    try:
        await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(3)])

        async def done() -> bool:
            dead = await conn.fetchval("select count(*) from ferry.dead_letters where subscription = 'failing'")
            return dead == 3 and len(ok.received) == 3

        await eventually(done, timeout=30, what="3 dead letters and 3 deliveries")
    finally:
        if relay.returncode is None:
            relay.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(relay.communicate(), 30)
    text = output.decode(errors="replace")
    assert "now delivering subscription failing" in text and "cannot deliver subscription broken" in text
    assert secret not in text and rotated not in text and broken not in text and "whsec_" not in text
    # signatures were made with the secrets and travelled (and were echoed back into the attempt rows) ...
    assert failing.stats.requests == 6 and len(ok.received[0].headers["webhook-signature"].split()) == 2
    records = await stored_text(conn)
    assert "webhook-signature: v1," in records
    # ... but no secret did
    assert secret not in records and rotated not in records and "whsec_" not in records


async def test_in_process_relay_logs_hold_no_secret_at_debug(
    db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    _, failing_url = await receiver_factory(echo_everything)
    ok, ok_url = await receiver_factory(lambda _: Respond(200))
    secret, rotated = await setup_subscriptions(ferry, conn, failing_url, ok_url)
    relay = RunningRelay(db_url)
    try:
        await ferry.publish("s", {"n": 1})

        async def done() -> bool:
            return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 1) and len(ok.received) == 1

        await eventually(done, what="a dead letter and a delivery")
        await conn.execute("select ferry.set_subscription_secrets('ok', array[$1])", rotated)  # rotation mid-run
        await asyncio.sleep(0.5)
        await ferry.publish("s", {"n": 2})

        async def second() -> bool:
            return len(ok.received) == 2

        await eventually(second, what="a delivery signed with the rotated secret")
    finally:
        await relay.stop()
    logged = caplog.text + "\n".join(str(r.args) + repr(r.__dict__) for r in caplog.records)
    assert len(caplog.records) > 5 and secret not in logged and rotated not in logged
    # what the relay holds of a subscription prints without its secrets
    sub = Subscription.from_row(await conn.fetchrow("select * from ferry.subscriptions where name = 'failing'"))
    assert sub.secrets == (secret,) and secret not in repr(sub) and secret not in str(sub)


def test_redaction_helper() -> None:
    secret = new_secret()
    assert redact_secrets(f"a {secret} b ({secret})") == "a whsec_*** b (whsec_***)"
    assert redact_secrets("nothing here") == "nothing here"
