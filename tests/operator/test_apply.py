"""`pgferry apply`: declarative subscriptions from a TOML file, run as a real subprocess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import orjson
import pytest

import pgferry
from pgferry.delivery.signing import new_secret
from pgferry.ops import apply as applying
from tests.operator.conftest import cli

FIRST = """
[subscriptions.billing]
streams = ["public.orders"]
url = "http://127.0.0.1:9/hooks/orders?token=query-secret-1"
secret_env = "BILLING_SECRET"
headers = { "X-Team" = "payments" }
headers_env = { Authorization = "BILLING_AUTH" }
ordered = true
max_age = "2 days"

[subscriptions.audit]
streams = ["public.orders", "public.refunds"]
url = "http://127.0.0.1:9/audit"
batch_size = 50
"""

SECOND = """
[subscriptions.billing]
streams = ["public.orders"]
url = "http://127.0.0.1:9/hooks/v2/orders"
secret_env = "BILLING_SECRET"
headers = { "X-Team" = "payments" }
headers_env = { Authorization = "BILLING_AUTH" }
ordered = true
max_age = "48 hours"
"""


async def test_apply_creates_updates_and_removes_only_what_it_manages(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, tmp_path: Path
) -> None:
    secret = new_secret()
    env = {"BILLING_SECRET": secret, "BILLING_AUTH": "Bearer header-secret-2"}
    secrets_shown = (secret, "header-secret-2", "query-secret-1")
    await ferry.subscribe("by-hand", ["x"], "http://127.0.0.1:9/by-hand")
    path = tmp_path / "pgferry.toml"
    path.write_text(FIRST)

    dry = await cli(pgferry_cmd, db_url, "apply", str(path), "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "+ create billing" in dry.stdout and "+ create audit" in dry.stdout
    assert "= unchanged by-hand (not managed by apply; left alone" in dry.stdout
    assert "dry run: 2 change(s) not applied" in dry.stdout
    assert not any(s in dry.stdout + dry.stderr for s in secrets_shown), dry.stdout
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 1

    applied = await cli(pgferry_cmd, db_url, "apply", str(path), env=env)
    assert applied.returncode == 0, applied.stderr
    assert "applied 2 change(s)" in applied.stdout
    assert not any(s in applied.stdout + applied.stderr for s in secrets_shown)
    row = await conn.fetchrow("select * from ferry.subscriptions where name = 'billing'")
    assert row["secrets"] == [secret] and row["ordered"] is True and row["managed_by"] == "apply"
    assert row["headers"] == {"X-Team": "payments", "Authorization": "Bearer header-secret-2"}
    assert await conn.fetchval("select batch_size from ferry.subscriptions where name = 'audit'") == 50
    assert await conn.fetchval("select count(*) from ferry.consumers where name like 'webhook:%'") == 3
    listed = await cli(pgferry_cmd, db_url, "subscription", "list", "--json")
    assert {"X-Team": "***", "Authorization": "***"} in [s["headers"] for s in orjson.loads(listed.stdout)]
    assert not any(s in listed.stdout for s in secrets_shown)

    again = await cli(pgferry_cmd, db_url, "apply", str(path), "--json", env=env)
    actions = {c["name"]: c["action"] for c in orjson.loads(again.stdout)["changes"]}
    assert actions == {"billing": "unchanged", "audit": "unchanged", "by-hand": "unchanged"}

    # audit leaves the file: removed (apply made it); by-hand stays; billing changes its url only
    # ("48 hours" is the interval "2 days" was, written differently).
    path.write_text(SECOND)
    plan = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--dry-run", "--json", env=env)).stdout)
    changes = {c["name"]: c for c in plan["changes"]}
    assert changes["audit"]["action"] == "remove" and changes["by-hand"]["action"] == "unchanged"
    assert changes["billing"]["action"] == "update"
    assert changes["billing"]["changes"]["url"] == {
        "from": "http://127.0.0.1:9/hooks/orders?…", "to": "http://127.0.0.1:9/hooks/v2/orders"}  # fmt: skip
    assert set(changes["billing"]["changes"]) == {"url"}
    rotated = {**env, "BILLING_SECRET": new_secret()}
    human = await cli(pgferry_cmd, db_url, "apply", str(path), env=rotated)
    assert human.returncode == 0, human.stderr
    assert "~ update billing" in human.stdout and "secrets:" in human.stdout and "- remove audit" in human.stdout
    assert rotated["BILLING_SECRET"] not in human.stdout
    names = [r["name"] for r in await conn.fetch("select name from ferry.subscriptions order by name")]
    assert names == ["billing", "by-hand"]
    assert await conn.fetchval("select secrets from ferry.subscriptions where name = 'billing'") == [
        rotated["BILLING_SECRET"]
    ]
    assert await conn.fetchval("select count(*) from ferry.consumers where name = 'webhook:audit'") == 0

    pruned = await cli(pgferry_cmd, db_url, "apply", str(path), "--prune", env=rotated)
    assert "- remove by-hand (not in the file (--prune))" in pruned.stdout
    assert [r["name"] for r in await conn.fetch("select name from ferry.subscriptions")] == ["billing"]


async def test_apply_refuses_bad_files_before_touching_anything(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "pgferry.toml"
    path.write_text(FIRST)
    missing = await cli(pgferry_cmd, db_url, "apply", str(path), env={"BILLING_AUTH": "x"})
    assert missing.returncode == 1 and "environment variable BILLING_SECRET is not set" in missing.stderr
    path.write_text('[subscriptions.a]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\nsecret = "whsec_abc"\n')
    literal = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert literal.returncode == 1 and "secrets do not belong in the file" in literal.stderr
    assert "whsec_abc" not in literal.stderr
    path.write_text('[subscriptions.a]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\nbatch_sise = 5\n')
    typo = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert typo.returncode == 1 and "unknown setting(s) batch_sise" in typo.stderr
    path.write_bytes('[subscriptions.caf\u00e9]\nstreams = ["s"]\n'.encode("latin-1"))
    latin = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert (
        latin.returncode == 1
        and latin.stderr
        == f"Error: {path} is not UTF-8 text (byte 18 is 0xe9); TOML files are UTF-8: save it as UTF-8\n"
    )
    # One bad subscription (a URL the database refuses) rolls back the whole apply.
    path.write_text('[subscriptions.a]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n\n'
                    '[subscriptions.b]\nstreams = ["s"]\nurl = "gopher://h/"\n')  # fmt: skip
    refused = await cli(pgferry_cmd, db_url, "apply", str(path))
    assert refused.returncode == 1 and "unsupported URL scheme 'gopher'" in refused.stderr
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0


async def test_a_dry_run_refuses_what_applying_would_naming_the_subscription(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """A dry run once passed settings only ferry.subscribe checks (CI would say a file is fine
    that then fails to apply), and a number out of int32 range was a traceback."""
    path = tmp_path / "pgferry.toml"
    head = '[subscriptions.ok]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n\n[subscriptions.bad]\nstreams = ["s"]\n'
    cases = {
        'url = "http://127.0.0.1:9/"\nmax_attempts = -3': "[subscriptions.bad]: pgferry: max_attempts must be between",
        'url = "http://127.0.0.1:9/"\npartitions = 0': "[subscriptions.bad]: pgferry: partitions must be between",
        'url = "http://127.0.0.1:9/"\nmax_age = "soon"': "[subscriptions.bad]: invalid value for max_age: invalid "
        "input syntax for type interval: \"soon\"; give a PostgreSQL interval such as '3 days'",
        'url = "nats://127.0.0.1:4222/o.{nope}"': "[subscriptions.bad]: pgferry: unknown placeholder {nope} in",
        'url = "http://127.0.0.1:9/"\nfilter = "$.("': "[subscriptions.bad]: pgferry: ",
        'url = "http://127.0.0.1:9/"\nheaders = { "X-A" = "a\\u0001b" }': "[subscriptions.bad]: pgferry: header 'X-A'",
        'url = "http://127.0.0.1:9/"\ntimeout_ms = 99999999999999': "timeout_ms = 99999999999999 is out of range",
    }
    for body, says in cases.items():
        path.write_text(head + body + "\n")
        for dry in (["--dry-run"], []):
            result = await cli(pgferry_cmd, db_url, "apply", str(path), *dry)
            assert result.returncode == 1 and says in result.stderr, (body, dry, result.stderr)
            assert "Traceback" not in result.stderr and "HINT:" not in result.stderr, result.stderr
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0


BROKERS = """
[subscriptions.to-nats]
streams = ["public.orders"]
url = "nats://127.0.0.1:4222/orders.{key}"
credentials_env = { user = "NATS_USER", password = "NATS_PASSWORD" }

[subscriptions.to-redis]
streams = ["public.orders"]
url = "redis://127.0.0.1:6379/0?stream=orders"
"""


async def test_apply_sets_broker_credentials_from_the_environment_and_never_shows_them(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "pgferry.toml"
    path.write_text(BROKERS)
    env = {"NATS_USER": "pf", "NATS_PASSWORD": "pw-secret-3"}
    applied = await cli(pgferry_cmd, db_url, "apply", str(path), env=env)
    assert applied.returncode == 0, applied.stderr
    assert "user, password from the environment" in applied.stdout and "pw-secret-3" not in applied.stdout
    stored = await conn.fetchval("select credentials from ferry.subscriptions where name = 'to-nats'")
    assert stored == {"user": "pf", "password": "pw-secret-3"}
    again = await cli(pgferry_cmd, db_url, "apply", str(path), "--dry-run", env={**env, "NATS_PASSWORD": "new-4"})
    assert "credentials" in again.stdout and "new-4" not in again.stdout
    path.write_text(BROKERS.replace('user = "NATS_USER"', 'pass = "NATS_USER"'))
    refused = await cli(pgferry_cmd, db_url, "apply", str(path), env=env)
    assert refused.returncode != 0 and "credentials_env.pass: expected one of user" in refused.stderr


def _race_file(letter: str) -> str:
    return "".join(
        f'[subscriptions.race-{letter}-{n}]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/{letter}/{n}"\n\n'
        for n in range(1, 11)
    )


async def test_two_applies_at_once_end_as_if_one_ran_after_the_other(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Two applies of different files, both from an empty apply state, read the subscriptions
    before either wrote: both exited 0 and left 10 x and 10 y, a state of neither file, or one said
    "nothing to change" of the other's file (outside verifier)."""
    files = {letter: tmp_path / f"{letter}.toml" for letter in "xy"}
    for letter, path in files.items():
        path.write_text(_race_file(letter))
    wanted = {letter: {f"race-{letter}-{n}" for n in range(1, 11)} for letter in "xy"}
    for _ in range(4):
        await conn.execute("select ferry.unsubscribe(name) from ferry.subscriptions")
        done = await asyncio.gather(*(cli(pgferry_cmd, db_url, "apply", str(p)) for p in files.values()))
        for result in done:
            assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
            # From an empty state, the first creates its 10 and the second replaces them with its own.
            assert "applied" in result.stdout and "nothing to change" not in result.stdout, result.stdout
        names = {r["name"] for r in await conn.fetch("select name from ferry.subscriptions")}
        assert names in (wanted["x"], wanted["y"]), sorted(names)


async def test_apply_refuses_values_of_the_wrong_type_naming_the_subscription_and_the_key(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Header values that were not strings were stored as Python's text of them ("True",
    "{'a': 1}"); a secret_env item that was not a string ended in a traceback; a refused secret
    did not say which variable held it; max_age "forever" lacked the CLI's hint (outside verifier)."""
    path = tmp_path / "pgferry.toml"
    head = '[subscriptions.ok]\nstreams = ["s"]\nurl = "http://127.0.0.1:9/"\n\n[subscriptions.bad]\nstreams = ["s"]\n'
    head += 'url = "http://127.0.0.1:9/"\n'
    env = {"S1": new_secret(), "S2": "whsec_tooshort", "NAME": "x"}
    cases = {
        'headers = { "X-Num" = 1 }': "[subscriptions.bad]: headers.X-Num must be a string, not the number 1",
        'headers = { "X-Bool" = true }': "headers.X-Bool must be a string, not the boolean true",
        'headers = { "X-Tbl" = { a = 1 } }': "[subscriptions.bad]: headers.X-Tbl must be a string, not a table",
        'headers = { "X-Arr" = ["a", "b"] }': "headers.X-Arr must be a string, not an array",
        'headers = { "X-Date" = 1979-05-27T07:32:00Z }': "headers.X-Date must be a string, not the date/time 1979",
        "headers_env = { Authorization = 1 }": "headers_env.Authorization must be a string, the name of an environment",
        "credentials_env = { user = true }": "credentials_env.user must be a string, the name of an environment",
        "secret_env = [1]": "[subscriptions.bad]: secret_env[0] must be a string, the name of an environment "
        "variable, not the number 1",
        'secret_env = ["S1", ["X"]]': "[subscriptions.bad]: secret_env[1] must be a string, the name of an "
        "environment variable, not an array",
        'secret_env = ["S1", "S2"]': "[subscriptions.bad]: secret_env S2: pgferry: signing secret is too short",
        'secret_env = ["S1", "S3"]': "[subscriptions.bad]: secret_env S3: environment variable S3 is not set",
        'max_age = "forever"': "Error: [subscriptions.bad]: invalid value for max_age: invalid input syntax for type "
        "interval: \"forever\"; give a PostgreSQL interval such as '3 days', '36 hours' or '90 minutes'",
    }
    for body, says in cases.items():
        path.write_text(head + body + "\n")
        for dry in (["--dry-run"], []):
            result = await cli(pgferry_cmd, db_url, "apply", str(path), *dry, env=env)
            assert result.returncode == 1 and says in result.stderr, (body, dry, result.stderr)
            assert "Traceback" not in result.stderr and env["S2"] not in result.stderr, result.stderr
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0


async def test_removals_say_what_goes_with_them_and_need_yes_when_retries_or_dead_letters_do(
    pgferry_cmd: list[str], db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Any file, /dev/null too, removed every subscription apply made, with its parked retries and
    dead letters, saying only "- remove NAME" (outside verifier)."""
    path = tmp_path / "pgferry.toml"
    path.write_text(_race_file("x"))
    assert (await cli(pgferry_cmd, db_url, "apply", str(path))).returncode == 0
    columns = "subscription, event_id, stream, payload, event_created_at, attempts"
    await conn.execute(
        f"insert into ferry.retries ({columns}, next_attempt_at) "
        "values ('race-x-1', 1, 's', '{}', now(), 1, now()), ('race-x-1', 2, 's', '{}', now(), 1, now())"
    )
    await conn.execute(
        f"insert into ferry.dead_letters ({columns}, first_failed_at) "
        "values ('race-x-2', 3, 's', '{}', now(), 1, now())"
    )
    path.write_text("")
    losses = "10 subscription(s) with their cursors, 2 parked retry(ies) and 1 dead letter(s)"

    dry = await cli(pgferry_cmd, db_url, "apply", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert ("- remove race-x-1 (created by apply, no longer in the file; its 2 parked retry(ies) and 0 dead "
            "letter(s) are deleted with it)") in dry.stdout  # fmt: skip
    assert "- remove race-x-3 (created by apply, no longer in the file)\n" in dry.stdout
    assert dry.stdout.endswith(f"dry run: 10 change(s) not applied; it would remove {losses}\n"), dry.stdout
    plan = orjson.loads((await cli(pgferry_cmd, db_url, "apply", str(path), "--dry-run", "--json")).stdout)
    counts = {c["name"]: (c["parked_retries"], c["dead_letters"]) for c in plan["changes"]}
    assert counts["race-x-1"] == (2, 0) and counts["race-x-2"] == (0, 1) and counts["race-x-3"] == (0, 0)

    for extra in ([], ["--json"]):  # not in a terminal: nothing to ask, so refused without --yes
        refused = await cli(pgferry_cmd, db_url, "apply", str(path), *extra)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr == f"Error: the apply would remove {losses}: nothing changed; give --yes to apply it\n"
        assert await conn.fetchval("select count(*) from ferry.subscriptions") == 10
        assert ("- remove race-x-2" in refused.stdout) == (not extra), refused.stdout  # the plan, then the refusal

    # What an operator agreed to lose is a bound: one more parked retry since the question, and the
    # removal is refused (a second outside probe: a yes to 11 parked retries removed 55).
    agreed = {c["name"]: (c["parked_retries"], c["dead_letters"]) for c in plan["changes"]}
    await conn.execute(
        f"insert into ferry.retries ({columns}, next_attempt_at) values ('race-x-1', 4, 's', '{{}}', now(), 1, now())"
    )
    with pytest.raises(applying.RemovalsNotAllowed):
        await applying.run(conn, applying.load(path), allow_losses=agreed)
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 10
    losses = losses.replace("2 parked", "3 parked")

    applied = await cli(pgferry_cmd, db_url, "apply", str(path), "--yes")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.endswith(f"applied 10 change(s); removed {losses}\n"), applied.stdout
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0
    assert await conn.fetchval("select count(*) from ferry.dead_letters") == 0


async def test_a_stream_listed_twice_in_the_file_is_one_stream_and_a_second_apply_changes_nothing(
    pgferry_cmd: list[str], db_url: str, tmp_path: Path
) -> None:
    """A second outside probe: ferry.subscribe keeps a stream listed twice once, and apply compared
    the file's list as written, so every apply (and every --dry-run) rewrote the subscription."""
    path = tmp_path / "pgferry.toml"
    path.write_text('[subscriptions.twice]\nstreams = ["s", "t", "s"]\nurl = "http://127.0.0.1:9/twice"\n')
    assert (await cli(pgferry_cmd, db_url, "apply", str(path))).returncode == 0
    for extra in (["--dry-run"], []):
        again = await cli(pgferry_cmd, db_url, "apply", str(path), *extra)
        assert again.returncode == 0 and "= unchanged twice" in again.stdout, (again.stdout, again.stderr)
