"""Broker URLs: parsing, clear refusals (in Python and in ferry.subscribe), and name templates."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pgferry
from pgferry.delivery.destinations import BadDestination, parse_nats, parse_redis, shown_url
from pgferry.delivery.model import OutEvent
from pgferry.errors import PgferryError
from tests.helpers import cli


def _event(stream: str = "public.orders", key: str | None = "42") -> OutEvent:
    return OutEvent(1, stream, key, "{}", None, datetime.now(UTC))


def test_urls_parse_into_host_port_and_templates() -> None:
    nats = parse_nats("nats://broker:4223/orders.{key}")
    assert (nats.host, nats.port, nats.subject.render(_event(), subject=True)) == ("broker", 4223, "orders.42")
    assert parse_nats("nats://broker/{stream}").subject.render(_event(), subject=True) == "public.orders"
    r = parse_redis("redis://cache:6380/2?stream=orders:{key}&maxlen=1000&dedup_window=60")
    assert (r.host, r.port, r.db, r.maxlen, r.dedup_window_s) == ("cache", 6380, 2, 1000, 60)
    assert r.stream.render(_event(key="a b.c"), subject=False) == "orders:a b.c"
    assert r.stream.render(_event(key=None), subject=False) == "orders:_"
    assert parse_redis("redis://cache?stream=s").port == 6379
    # a URL's query, not a form's: "+" is a plus (it was a space), a space is %20
    assert parse_redis("redis://cache?stream=orders+eu").stream.text == "orders+eu"
    assert parse_redis("redis://cache?stream=orders%20eu%2Bx").stream.text == "orders eu+x"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("nats://broker:4222/", "names no subject"),
        ("nats://broker:4222/orders.*", "wildcards"),
        ("nats://broker:4222/orders..x", "empty tokens"),
        ("nats://broker:4222/orders.{id}", "unknown placeholder {id}"),
        ("nats://u:p@broker:4222/orders", "credentials do not go in the URL"),
        ("nats://broker:4222/$JS.API.STREAM.PURGE.{key}", "a subject of the NATS server itself"),
        ("nats://broker:4222/_INBOX.x", "a subject of the NATS server itself"),
        ("redis://cache:6379/0", "names no Redis stream"),
        ("redis://cache:6379/x?stream=s", "not a Redis database number"),
        ("redis://cache:6379/0?stream=s&maxlen=0", "maxlen='0'"),
        # a digit to str.isdigit, not to int(): a traceback (outside probe)
        ("redis://cache:6379/0?stream=s&maxlen=²", "maxlen='²'"),
        ("redis://cache:6379/²?stream=s", "not a Redis database number"),
        ("redis://cache:6379/0?stream=s&ttl=5", "unknown Redis parameter 'ttl'"),
        ("redis://cache:6379/0?stream=s{key", "unbalanced braces"),
        ("redis://cache:6379/0?stream={a{key}b}", "unbalanced braces in '{a{key}b}'"),
        ("redis://cache:6379/0?stream=%7Borders%7D:{key}", "unknown placeholder {orders} in '{orders}:{key}'"),
        ("redis://cache:6379/abc?stream=x", "'abc' is not a Redis database number"),
        # each accepted once, and failing at every send (found by an outside probe):
        ("nats://broker:99999/x", "has a port out of range (1-65535)"),
        ("nats://[::1/x", "Invalid IPv6 URL"),
        ("redis://cache:6379/0?stream=s&maxlen=99999999999999999999", "from 1 to 2147483647"),
        ("redis://cache:6379/0?stream=s&dedup_window=99999999999999999999", "from 1 to 2147483647"),
        ("redis://cache:6379/0?stream=a&stream=b", "'stream' is given more than once"),
    ],
)
def test_bad_urls_are_refused_with_what_is_wrong(url: str, says: str) -> None:
    parse = parse_nats if url.startswith("nats") else parse_redis
    with pytest.raises(BadDestination, match=None) as caught:
        parse(url)
    assert says in str(caught.value)


def test_a_template_is_rendered_in_one_pass_so_a_stream_holding_key_stays_as_it_is() -> None:
    """`{stream}` was replaced first and then every `{key}`, the stream's own too: stream `ev{key}il`
    with key k1 went to `tpl:evk1il:k1`, the Redis stream of stream `evk1il` (outside probe)."""
    template = parse_redis("redis://cache/0?stream=tpl:{stream}:{key}").stream
    assert template.render(_event(stream="ev{key}il", key="k1"), subject=False) == "tpl:ev{key}il:k1"
    assert template.render(_event(stream="evk1il", key="k1"), subject=False) == "tpl:evk1il:k1"
    assert (
        parse_redis("redis://cache/0?stream={key}").stream.render(_event(key="{stream}"), subject=False) == "{stream}"
    )


def test_doubled_braces_are_literal_braces_for_a_redis_cluster_hash_tag() -> None:
    """docs/sinks.md told Redis Cluster users to put a `{hash tag}` in the stream name, and every
    brace but {stream} and {key} was refused as an unknown placeholder."""
    tagged = parse_redis("redis://cache/0?stream={{orders}}:{key}").stream
    assert tagged.render(_event(key="k1"), subject=False) == "{orders}:k1" and not tagged.fixed
    fixed = parse_redis("redis://cache/0?stream=%7B%7Borders%7D%7D").stream
    assert fixed.fixed and fixed.name == "{orders}" and fixed.render(_event(), subject=False) == "{orders}"
    assert parse_redis("redis://cache/0?stream={{{key}}}").stream.render(_event(key="k"), subject=False) == "{k}"
    assert parse_nats("nats://b/a.{{x}}.{key}").subject.render(_event(key="k"), subject=True) == "a.{x}.k"


@given(st.text(min_size=1, max_size=40))
def test_a_stream_name_never_makes_an_empty_token(stream: str) -> None:
    """A stream x..y made subject sp.x..y.k, which no server takes (recorded as "no stream captures it")."""
    subject = parse_nats("nats://b/sp.{stream}.{key}").subject.render(_event(key="k", stream=stream), subject=True)
    tokens = subject.split(".")
    assert tokens[0] == "sp" and tokens[-1] == "k" and all(tokens), subject


@given(st.text(min_size=1, max_size=40))
def test_a_key_is_always_exactly_one_publishable_token_that_decodes_back(key: str) -> None:
    subject = parse_nats("nats://b/orders.{key}.v1").subject.render(_event(key=key), subject=True)
    tokens = subject.split(".")
    assert len(tokens) == 3 and tokens[0] == "orders" and tokens[2] == "v1"
    token = tokens[1]
    assert token and token.isascii() and not any(c.isspace() or c in "*>" for c in token)
    assert unquote(token) == key or (key == "_" and token == "_")


async def test_subscribe_refuses_bad_broker_urls_in_sql_and_in_python(conn: asyncpg.Connection,
                                                                        ferry: pgferry.Ferry) -> None:  # fmt: skip
    for url, says in [
        ("nats://127.0.0.1:4222", "names no subject"),
        ("redis://127.0.0.1:6379/0", "names no Redis stream"),
        ("nats://127.0.0.1:4222/a.{nope}", "unknown placeholder"),
        ("kafka://127.0.0.1:9092/t", "unsupported URL scheme"),
        ("http://127.0.0.1:65536/hook", "port out of range"),
        # Refused by `subscription add` only, before (outside probe): wildcards, empty tokens, spaces.
        ("nats://127.0.0.1:4222/k.*", "not a subject to publish to"),
        ("nats://127.0.0.1:4222/k.>", "not a subject to publish to"),
        ("nats://127.0.0.1:4222/k..{key}", "not a subject to publish to"),
        ("nats://127.0.0.1:4222/k%20x.{key}", "not a subject to publish to"),
        ("nats://127.0.0.1:4222/k.%3E", "not a subject to publish to"),
        # Taken by subscribe, then every event failed on the relay (outside probe).
        ("redis://127.0.0.1:6379/0?stream=s&maxlen=abc", "maxlen='abc': expected a whole number"),
        ("redis://127.0.0.1:6379/0?stream=s&maxlen=-5", "maxlen='-5': expected a whole number"),
        ("redis://127.0.0.1:6379/0?stream=s&maxlen=0", "maxlen='0': expected a whole number"),
        ("redis://127.0.0.1:6379/0?stream=s&dedup_window=0", "dedup_window='0'"),
        ("redis://127.0.0.1:6379/0?stream=s&maxlen=99999999999999999999", "from 1 to 2147483647"),
        ("redis://127.0.0.1:6379/0?stream=s&strem=x", "unknown Redis parameter 'strem'"),
        ("redis://127.0.0.1:6379/0?stream=a&stream=b", "'stream' is given more than once"),
        ("http://127.0.0.1:9/caf\u00e9", "outside ASCII; percent-encode"),
        ("http://127.0.0.1:9/x?a=\u00e9", "outside ASCII; percent-encode"),
        # Commands and replies of the server: $JS.API.STREAM.PURGE.{key} purged a stream (outside probe).
        ("nats://127.0.0.1:4222/$JS.API.STREAM.PURGE.{key}", "a subject of the NATS server itself"),
        ("nats://127.0.0.1:4222/%24SYS.x", "a subject of the NATS server itself"),
        ("nats://127.0.0.1:4222/_INBOX.abc", "a subject of the NATS server itself"),
    ]:
        with pytest.raises(asyncpg.InvalidParameterValueError, match=says):
            await conn.execute("select ferry.subscribe('x', array['s'], $1)", url)
    for url in (
        "nats://user:s3cretpw@127.0.0.1:4222/orders",
        "redis://:s3cretpw@127.0.0.1:6379/0?stream=s",
        "https://u:s3cretpw@example.com/hook",
    ):
        with pytest.raises(asyncpg.InvalidParameterValueError) as refused:  # and not echoed (nor logged)
            await conn.execute("select ferry.subscribe('x', array['s'], $1)", url)
        assert "credentials do not go in the URL" in str(refused.value) and "s3cretpw" not in str(refused.value)
    with pytest.raises(PgferryError, match="maxlen"):
        await ferry.subscribe("x", ["s"], "redis://127.0.0.1:6379/0?stream=s&maxlen=-1")
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0
    for url in ("redis://127.0.0.1:6379/0?stream=s&maxlen=1000&dedup_window=60", "http://127.0.0.1:9/caf%C3%A9"):
        await conn.execute("select ferry.subscribe('ok', array['s'], $1)", url)  # still taken
        await conn.execute("select ferry.unsubscribe('ok')")


BROKER_URLS_REFUSED_ALIKE = [
    # ferry.subscribe and apply matched the braces of the encoded URL: the relay decodes %7B first
    # and failed every event with "unknown placeholder {orders}" (outside probe)
    "redis://127.0.0.1:6379/0?stream=%7Borders%7D:{key}",
    "redis://127.0.0.1:6379/0?stream={orders}:{key}",
    "redis://127.0.0.1:6379/0?stream=s{key",
    "redis://127.0.0.1:6379/0?stream={a{key}b}",
    "redis://127.0.0.1:6379/0?stream=}}}",
    "nats://127.0.0.1:4222/a.%7Bnope%7D",
    "nats://127.0.0.1:4222/a.{x}.{y}",
    # "names no Redis stream", for a database that is not a number
    "redis://127.0.0.1:6379/abc?stream=x",
    # The wordings differed between `subscription add` and ferry.subscribe; some echoed the query
    # (a secret in it), named the wrong fault or accepted what every attempt then failed on
    # (outside probe).
    "redis://127.0.0.1:6379/0?stream=x&password=LeakyQuerySecret42",
    "redis://127.0.0.1:6379/0?stream=x&LeakyQuerySecret42",
    "redis://127.0.0.1:6379/0?token=LeakyQuerySecret42",
    "redis://127.0.0.1:6379/0?stream=x&stream=y",
    "redis://127.0.0.1:6379/0?stream=x&maxlen=abc",
    "redis://127.0.0.1:6379/0?stream=x&dedup_window=0",
    "redis://127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/0?stream=",
    "redis://127.0.0.1:6379/99999999999999999999?stream=x",
    "redis://127.0.0.1:6379/2147483647?stream=x",
    "redis:///0?stream=x",
    "redis://127.0.0.1:99999/0?stream=x",
    "redis://:LeakyPw@127.0.0.1:6379/0?stream=x",
    "nats://127.0.0.1:4222/orders?token=LeakyQuerySecret42",
    "nats://127.0.0.1:4222/orders#LeakyFragment",
    "nats:///orders",
    "nats://127.0.0.1:4222",
    "nats://127.0.0.1:4222/",
    "nats://127.0.0.1:99999/orders",
    "nats://127.0.0.1:0/orders",
    "nats://127.0.0.1:abc/orders",
    "nats://u:LeakyPw@127.0.0.1:4222/orders",
]


async def test_subscribe_apply_and_subscription_add_refuse_the_same_broker_urls_with_the_same_words(
    conn: asyncpg.Connection, ferry: pgferry.Ferry, pgferry_cmd: list[str], db_url: str, tmp_path: Path
) -> None:
    for url in BROKER_URLS_REFUSED_ALIKE:
        parse = parse_nats if url.startswith("nats") else parse_redis
        with pytest.raises(BadDestination) as by_relay:
            parse(url)
        words = f"pgferry: {by_relay.value}"
        with pytest.raises(asyncpg.InvalidParameterValueError) as by_sql:
            await conn.execute("select ferry.subscribe('x', array['s'], $1)", url)
        assert by_sql.value.message == words, url  # (its hint apart)
        with pytest.raises(PgferryError) as by_api:  # `pgferry subscription add`
            await ferry.subscribe("x", ["s"], url)
        assert str(by_api.value) == words, url
        plan = tmp_path / "bad.toml"
        plan.write_text(f'[subscriptions.bad]\nstreams = ["s"]\nurl = "{url}"\n')
        applied = await cli(pgferry_cmd, db_url, "apply", str(plan), "--dry-run")
        assert applied.returncode != 0 and words in applied.stderr, (url, applied.stdout, applied.stderr)
        assert "Leaky" not in words, words  # no query, fragment or password shown
    for url in (
        "redis://127.0.0.1:6379/0?stream={{orders}}:{key}",
        "redis://127.0.0.1:6379/0?stream=%7B%7Bo%7D%7D",
        "redis://127.0.0.1:6379/2147483646?stream=x",  # a database a server can have
    ):
        await conn.execute("select ferry.subscribe('ok', array['s'], $1)", url)  # a hash tag: taken
        await conn.execute("select ferry.unsubscribe('ok')")
    assert await conn.fetchval("select count(*) from ferry.subscriptions") == 0


async def test_credentials_are_checked_kept_apart_and_never_listed(
    conn: asyncpg.Connection, pgferry_cmd: list[str], db_url: str
) -> None:
    await conn.execute("select ferry.subscribe('b', array['s'], 'nats://127.0.0.1:4222/s')")
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unknown credential 'pass'"):
        await conn.execute("""select ferry.set_subscription_credentials('b', '{"pass": "x"}')""")
    with pytest.raises(asyncpg.UndefinedObjectError, match="does not exist"):
        await conn.execute("""select ferry.set_subscription_credentials('nope', '{"token": "x"}')""")
    await conn.execute("select ferry.subscribe('w', array['s'], 'https://127.0.0.1:9/x')")
    await conn.execute("select ferry.subscribe('r', array['s'], 'redis://127.0.0.1:6379/0?stream=s')")
    for name, credentials, says in [  # each taken before, and used by nothing (outside probe)
        ("w", '{"token": "x"}', "subscription 'w' is a webhook: credentials are for NATS and Redis"),
        ("b", '{"token": "x", "user": "u", "password": "p"}', "give one way to log in"),
        ("r", '{"token": "x"}', "Redis takes a password, or a user and a password"),
        ("r", '{"user": "bob"}', "user 'bob' needs a password"),  # logged in as "default" instead
        ("b", '{"user": "bob"}', "user 'bob' needs a password"),
    ]:
        with pytest.raises(asyncpg.InvalidParameterValueError, match=says):
            await conn.execute("select ferry.set_subscription_credentials($1, $2::text::jsonb)", name, credentials)
    await conn.execute("select ferry.set_subscription_credentials('w', '{}')")  # removing none is fine
    await conn.execute("select ferry.unsubscribe('w'), ferry.unsubscribe('r')")
    done = await cli(pgferry_cmd, db_url, "subscription", "credentials", "b", "--user", "pf", "--password-env",
                     "PF_SECRET", env={"PF_SECRET": "hunter22"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "credentials set (user, password)" in done.stdout and "hunter22" not in done.stdout
    assert await conn.fetchval("select credentials from ferry.subscriptions") == {"user": "pf", "password": "hunter22"}
    for command in (["subscription", "list", "--json"], ["status", "--json"]):
        shown = await cli(pgferry_cmd, db_url, *command)
        assert shown.returncode == 0 and "hunter22" not in shown.stdout + shown.stderr
    alone = await cli(pgferry_cmd, db_url, "subscription", "credentials", "b", "--user", "bob")
    assert alone.returncode != 0 and "Error: pgferry: user 'bob' needs a password" in alone.stderr, alone.stderr
    assert "Traceback" not in alone.stderr
    missing = await cli(pgferry_cmd, db_url, "subscription", "credentials", "b", "--password-env", "PF_UNSET")
    assert missing.returncode != 0 and "PF_UNSET is not set" in missing.stderr
    cleared = await cli(pgferry_cmd, db_url, "subscription", "credentials", "b", "--clear")
    assert cleared.returncode == 0 and await conn.fetchval("select credentials from ferry.subscriptions") == {}


async def test_a_broker_url_is_shown_whole_and_a_webhook_s_query_hidden(conn: asyncpg.Connection) -> None:
    """A change of a Redis stream showed in `apply --dry-run` as "?… -> ?…" (outside probe); a
    broker URL holds no credentials (refused), a webhook's query often does."""
    urls = {"r": "redis://127.0.0.1:6379/0?stream=orders:{key}&maxlen=10", "w": "https://h.example/x?token=abc"}
    for name, url in urls.items():
        await conn.execute("select ferry.subscribe($1, array['s'], $2)", name, url)
    assert shown_url(urls["r"]) == urls["r"] and shown_url(urls["w"]) == "https://h.example/x?…"
    status = dict(await conn.fetch("select name, url from ferry.subscription_status()"))  # `pgferry status`
    assert status == {"r": urls["r"], "w": "https://h.example/x?…"}
