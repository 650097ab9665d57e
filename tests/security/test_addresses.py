"""SSRF: which addresses the relay refuses, checked on the address actually connected to.

Everything here runs against receivers on 127.0.0.x; "refused" always means
refused before a connection was made (the receivers count connections), and
ranges that are not on this machine are only ever refused, never contacted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import subprocess

import asyncpg
import pytest

import pgferry
from pgferry.delivery.addresses import AddressPolicy, parse_networks
from pgferry.delivery.fasthttp import FastSender
from pgferry.delivery.http import HttpResult
from pgferry.receiver import Receiver, Respond
from pgferry.schema import install
from tests.helpers import FAST, MakeReceiver, RunningRelay, eventually

STRICT = AddressPolicy(strict=True)


async def send_both(policy: AddressPolicy, url: str) -> list[HttpResult]:
    """The same POST as a webhook and as a pg_net request (whole answer kept, redirects followed)."""
    sender = FastSender(pool_size=2, policy=policy)
    headers = {"content-type": "application/json"}
    try:
        return [
            await sender.send(url, b"{}", headers, timeout=2, connect_timeout=1),
            await sender.request("POST", url, b"{}", headers, timeout=2, connect_timeout=1, capture=True, redirects=30),
        ]
    finally:
        await sender.close()


async def test_strict_mode_refuses_a_name_resolving_to_loopback_without_connecting(
    receiver_factory: MakeReceiver,
) -> None:
    receiver, url = await receiver_factory()
    port = receiver.port
    # Every spelling that reaches the receiver on this machine: a name (checked
    # after DNS, which is what defeats DNS rebinding), IP literals, legacy
    # numeric forms, IPv4-mapped IPv6 and the unspecified address.
    spellings = ["localhost", "127.0.0.1", "2130706433", "127.1", "[::ffff:127.0.0.1]", "0.0.0.0"]
    for host in spellings:
        for result in await send_both(STRICT, f"http://{host}:{port}/hook"):
            assert result.error_class in ("refused_address", "bad_request"), (host, result)
            if result.error_class == "refused_address":
                text = result.error or ""
                assert "strict mode" in text and "PGFERRY_ALLOW_ADDRESSES" in text, (host, text)
    assert receiver.stats.connections == 0
    # the default policy lets local development reach loopback
    assert all(r.ok for r in await send_both(AddressPolicy(), url))
    assert receiver.stats.requests == 2  # one kept-alive connection carried both


@pytest.mark.parametrize(
    ("ip", "rule"),
    [
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("[fc00::1]", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"),
        ("[ff02::1]", "multicast"),
        ("[::1]", "loopback"),
        ("169.254.169.254", "cloud-metadata"),
        ("[fd00:ec2::254]", "cloud-metadata"),
        ("198.18.0.1", "special-purpose"),  # these six were allowed in strict mode (outside probe)
        ("192.0.2.1", "special-purpose"),
        ("192.0.0.8", "special-purpose"),
        ("[fec0::1]", "special-purpose"),
        ("[2001::1]", "special-purpose"),
        ("[64:ff9b:1::a00:1]", "private"),  # local-use NAT64 to 10.0.0.1
    ],
)
async def test_strict_mode_refuses_private_cgnat_multicast_ranges_by_rule(ip: str, rule: str) -> None:
    for result in await send_both(STRICT, f"http://{ip}:80/x"):
        assert result.error_class == "refused_address", result
        assert rule in (result.error or ""), result
        assert result.latency_ms < 500  # refused before any connection attempt


@pytest.mark.parametrize(
    "ip",
    [
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
        "[64:ff9b:1::a9fe:a9fe]",
        "[::a9fe:a9fe]",
        "[::ffff:0:a9fe:a9fe]",
    ],
)
async def test_the_other_clouds_metadata_addresses_and_forms_reaching_link_local_are_always_refused(ip: str) -> None:
    """Alibaba's, Azure's WireServer and Oracle's legacy metadata addresses, and local-use NAT64,
    IPv4-compatible and IPv4-translated forms of 169.254.169.254, were allowed by default (outside probe)."""
    for result in await send_both(AddressPolicy(), f"http://{ip}:80/x"):
        assert result.error_class == "refused_address" and "cloud-metadata" in (result.error or ""), result


async def test_allow_list_overrides_strict_mode_for_the_listed_range_only(receiver_factory: MakeReceiver) -> None:
    receiver, _ = await receiver_factory()
    policy = AddressPolicy(strict=True, allow=parse_networks("127.0.0.1/32"))
    assert all(r.ok for r in await send_both(policy, f"http://localhost:{receiver.port}/hook"))
    other = Receiver()
    url = await other.start(host="127.0.0.2")
    try:
        assert all(r.error_class == "refused_address" for r in await send_both(policy, url))
        assert other.stats.connections == 0
    finally:
        await other.stop()


def test_allow_list_parsing_and_metadata_override() -> None:
    # Only checked, never connected to: these addresses are not on this machine.
    assert AddressPolicy().refusal("169.254.169.254") is not None
    allowed = AddressPolicy(allow=parse_networks("169.254.169.254, fd00:ec2::254"))
    assert allowed.refusal("169.254.169.254") is None and allowed.refusal("fd00:ec2::254") is None
    assert allowed.refusal("169.254.169.253") is not None
    # IPv6 spellings that reach an IPv4 address are judged as that address: mapped, NAT64, 6to4
    for ip in ("::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1"):
        assert "169.254.169.254 is a link-local or cloud-metadata address" in (AddressPolicy().refusal(ip) or ""), ip
    assert "10.0.0.1 is a private address" in (STRICT.refusal("64:ff9b::a00:1") or "")
    assert AddressPolicy.from_env(
        {"PGFERRY_ALLOW_ADDRESSES": "10.0.0.0/8 192.168.0.1", "PGFERRY_STRICT_ADDRESSES": "1"}
    ) == (
        AddressPolicy(strict=True, allow=(ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("192.168.0.1/32")))
    )
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an IP address or CIDR range"):
        parse_networks("10.0.0.0/33")


async def test_pg_net_sender_refuses_a_redirect_to_a_refused_name() -> None:
    """A (allowed, 127.0.0.2) redirects to localhost (refused): B on 127.0.0.1 never sees a connection."""
    target = Receiver()
    target_url = await target.start(host="127.0.0.1")
    bouncer = Receiver(lambda _: Respond(302, b"", (("Location", target_url.replace("127.0.0.1", "localhost")),)))
    bounce_url = await bouncer.start(host="127.0.0.2")
    sender = FastSender(pool_size=2, policy=AddressPolicy(strict=True, allow=parse_networks("127.0.0.2")))
    try:
        result = await sender.request("GET", bounce_url, None, {}, timeout=2, connect_timeout=1, redirects=30)
    finally:
        await sender.close()
        await bouncer.stop()
        await target.stop()
    assert result.error_class == "refused_address" and "loopback" in (result.error or ""), result
    assert bouncer.stats.requests == 1 and target.stats.connections == 0


async def test_relay_in_strict_mode_dead_letters_refused_endpoints_and_keeps_delivering(
    db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    local, _ = await receiver_factory()
    allowed = Receiver()
    allowed_url = await allowed.start(host="127.0.0.2")
    bouncer = Receiver(lambda _: Respond(302, b"", (("Location", f"http://localhost:{local.port}/bounced"),)))
    bounce_url = await bouncer.start(host="127.0.0.2")
    await install(conn, addons=["pg_net"])
    settings = dataclasses.replace(FAST, addresses=AddressPolicy(strict=True, allow=parse_networks("127.0.0.2")))
    relay = RunningRelay(db_url, settings)
    try:
        await ferry.subscribe("tenant-a", ["s"], f"http://localhost:{local.port}/hook", max_attempts=5)
        await ferry.subscribe("tenant-b", ["s"], allowed_url)
        await ferry.publish("s", {"n": 1})
        # the pg_net API: directly, and through a redirect from an allowed host
        direct = await conn.fetchval("select net.http_get($1)", f"http://localhost:{local.port}/direct")
        bounced = await conn.fetchval("select net.http_get($1)", bounce_url)

        async def settled() -> bool:
            dead = await conn.fetchval("select count(*) from ferry.dead_letters where subscription = 'tenant-a'")
            answered = await conn.fetchval("select count(*) from net._http_response")
            return dead == 1 and answered == 2 and len(allowed.received) == 1

        await eventually(settled, what="one dead letter, two pg_net answers and one delivery")
        for request in (direct, bounced):
            error = await conn.fetchval("select error_msg from net._http_response where id = $1", request)
            assert "127.0.0.1 is a loopback address (refused in strict mode" in error, error
        assert bouncer.stats.requests == 1
        letter = await conn.fetchrow(
            "select subscription, attempts, last_error from ferry.dead_letters where subscription = 'tenant-a'"
        )
        attempt = await conn.fetchrow(
            "select error_class, error from ferry.attempt_history() where subscription = 'tenant-a'"
        )
        assert letter["subscription"] == "tenant-a" and letter["attempts"] == 1  # permanent: no retries
        assert attempt["error_class"] == "refused_address"
        assert "127.0.0.1 is a loopback address (refused in strict mode" in letter["last_error"]
        assert "PGFERRY_ALLOW_ADDRESSES" in letter["last_error"]
        assert local.stats.connections == 0
        assert not relay.task.done()
    finally:
        await relay.stop()
        await allowed.stop()
        await bouncer.stop()


async def test_subscribe_refuses_metadata_ip_literals_unless_the_session_allows_them(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.PostgresError, match="link-local or cloud-metadata address") as refused:
        await conn.execute("select ferry.subscribe('meta', array['s'], 'http://169.254.169.254/latest')")
    assert "pgferry.allow_addresses" in (refused.value.hint or "")
    await conn.execute("set pgferry.allow_addresses = '10.0.0.0/8, 169.254.169.254/32'")
    await conn.execute("select ferry.subscribe('meta', array['s'], 'http://169.254.169.254/latest')")
    with pytest.raises(asyncpg.PostgresError, match="link-local or cloud-metadata address"):
        await conn.execute("select ferry.subscribe('meta2', array['s'], 'http://169.254.169.253/latest')")


async def test_pgferry_run_strict_mode_and_allow_list_from_the_environment(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection, receiver_factory: MakeReceiver
) -> None:
    local, _ = await receiver_factory()
    allowed = Receiver()
    allowed_url = await allowed.start(host="127.0.0.2")
    try:
        await ferry.subscribe("tenant-a", ["s"], f"http://localhost:{local.port}/hook")
        await ferry.subscribe("tenant-b", ["s"], allowed_url)
        await ferry.publish("s", {"n": 1})
        env = {**os.environ, "PGFERRY_DATABASE_URL": db_url, "PGFERRY_STRICT_ADDRESSES": "1",
               "PGFERRY_ALLOW_ADDRESSES": "127.0.0.2/32,192.0.2.0/24"}  # fmt: skip
        run = await asyncio.create_subprocess_exec(
            *pgferry_cmd, "run", "--exit-after", "20", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:

            async def settled() -> bool:
                dead = await conn.fetchval("select count(*) from ferry.dead_letters where subscription = 'tenant-a'")
                return bool(dead == 1) and len(allowed.received) == 1

            await eventually(settled, timeout=20, what="tenant-a refused, tenant-b delivered")
        finally:
            if run.returncode is None:
                run.terminate()
            output, _ = await asyncio.wait_for(run.communicate(), 30)
    finally:
        await allowed.stop()
    assert local.stats.connections == 0
    text = output.decode()
    assert "address policy strict" in text and "allowed: 127.0.0.2/32, 192.0.2.0/24" in text
    assert "loopback address (refused in strict mode" in await conn.fetchval(
        "select last_error from ferry.dead_letters"
    )
    bad = await asyncio.to_thread(
        subprocess.run, [*pgferry_cmd, "run", "--allow-address", "10.0.0.0/33", "--exit-after", "1"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PGFERRY_DATABASE_URL": db_url},
    )  # fmt: skip
    assert bad.returncode == 2 and "'10.0.0.0/33' is not an IP address or CIDR range" in bad.stderr
