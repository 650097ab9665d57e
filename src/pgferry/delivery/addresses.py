"""Which network addresses the relay refuses to send to (SSRF protection).

A webhook URL is chosen by whoever can call ferry.subscribe or net.http_*,
and the relay usually runs inside a network that trusts it. Cloud metadata
services (169.254.169.254, fd00:ec2::254) and link-local addresses hand out
credentials to anyone who can make the relay fetch them, so they are refused
always. The check is made on the addresses a host name resolves to, right
before connecting to exactly one of them, so a name that re-resolves to a
forbidden address (DNS rebinding) is refused too. Loopback stays allowed so
local development works.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

ALWAYS_REFUSED = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


class RefusedAddress(OSError):
    """Every address of the host is one the relay must not connect to."""


def refusal(ip: str) -> str | None:
    """Why ``ip`` is refused, or None when it may be used."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for network in ALWAYS_REFUSED:
        if address in network:
            return f"{address} is a link-local or cloud-metadata address; refused to prevent SSRF"
    return None


async def allowed_addresses(host: str, port: int) -> list[tuple[int, str]]:
    """(family, ip) of ``host`` that may be connected to; RefusedAddress if none."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    allowed: list[tuple[int, str]] = []
    reasons = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        reason = refusal(ip)
        if reason is None:
            allowed.append((family, ip))
        else:
            reasons.append(reason)
    if not allowed:
        raise RefusedAddress(f"{host}: {reasons[0] if reasons else 'no address'}")
    return allowed
