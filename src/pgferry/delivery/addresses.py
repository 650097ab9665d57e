"""Which network addresses the relay refuses to send to (SSRF protection).

A webhook URL is chosen by whoever can call ferry.subscribe or net.http_*,
and the relay usually runs inside a network that trusts it. Cloud metadata
services (169.254.169.254, fd00:ec2::254) and link-local addresses hand out
credentials to anyone who can make the relay fetch them, so they are refused
always, unless an operator lists them explicitly (``PGFERRY_ALLOW_ADDRESSES``).
Multi-tenant deployments, where the people choosing URLs are not the people
running the relay, turn on strict mode (``--strict-addresses``), which also
refuses loopback, private, CGNAT, unspecified and multicast ranges.

The check is made on the addresses a host name resolves to, right before
connecting to exactly one of them, so a name that re-resolves to a forbidden
address (DNS rebinding) is refused too. Loopback stays allowed by default so
local development works.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_ENV_VAR = "PGFERRY_ALLOW_ADDRESSES"
STRICT_ENV_VAR = "PGFERRY_STRICT_ADDRESSES"
_HOW_TO_ALLOW = f"to allow it, list it in {ALLOW_ENV_VAR} (or `pgferry run --allow-address CIDR`)"


@dataclass(frozen=True, slots=True)
class Rule:
    """A named set of ranges, so a refusal can say which rule refused."""

    name: str
    networks: tuple[Network, ...]

    def matches(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


def _nets(*cidrs: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


#: Refused whatever the mode: where cloud credentials live (link-local, which holds AWS's, GCP's and
#: Azure's metadata; AWS's IPv6 one; Alibaba's, Azure's WireServer and Oracle's legacy address, which
#: an outside probe found allowed).
ALWAYS_REFUSED = (
    Rule(
        "link-local or cloud-metadata address",
        _nets(
            "169.254.0.0/16",
            "fe80::/10",
            "fd00:ec2::254/128",
            "100.100.100.200/32",
            "168.63.129.16/32",
            "192.0.0.192/32",
        ),
    ),
)

#: Refused too in strict mode: everything that is not the public internet.
STRICT_REFUSED = (
    Rule("loopback address", _nets("127.0.0.0/8", "::1/128")),
    Rule("private address", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
    Rule("carrier-grade NAT address", _nets("100.64.0.0/10")),
    Rule("unspecified address", _nets("0.0.0.0/8", "::/128")),
    Rule("multicast address", _nets("224.0.0.0/4", "ff00::/8")),
    Rule("reserved address", _nets("240.0.0.0/4")),
    # IANA's special-purpose ranges that are not the internet either: protocol assignments,
    # documentation, benchmarking, deprecated site-local, Teredo, discard, local-use NAT64.
    Rule(
        "special-purpose address",
        _nets(
            "192.0.0.0/24",
            "192.0.2.0/24",
            "198.18.0.0/15",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "fec0::/10",
            "2001::/32",
            "2001:db8::/32",
            "100::/64",
            "64:ff9b:1::/48",
        ),
    ),
)


class RefusedAddress(OSError):
    """Every address of the host is one the relay must not connect to."""


def parse_networks(text: str | Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) from ``"a,b c"`` or a list; ValueError naming a bad one."""
    items = (
        text.replace(",", " ").split()
        if isinstance(text, str)
        else [i for t in text for i in t.replace(",", " ").split()]
    )
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"{item!r} is not an IP address or CIDR range ({exc})") from None
    return tuple(networks)


#: NAT64 prefixes: the well-known one (RFC 6052) and the local-use one (RFC 8215) as deployed with a
#: /96, whose last 32 bits are the IPv4 address reached; and the IPv4-translated (::ffff:0:0/96) and
#: deprecated IPv4-compatible (::/96) forms, which stacks may route to the IPv4 address too.
_NAT64 = _nets("64:ff9b::/96", "64:ff9b:1::/48", "::ffff:0:0:0/96", "::/96")
_NOT_IPV4 = _nets("::/127")  # :: and ::1 are not 0.0.0.0 and 0.0.0.1


def _plain(ip: str) -> Address:
    """The address without a zone id. IPv6 forms that reach an IPv4 address (IPv4-mapped,
    NAT64, 6to4) are judged as that IPv4 address: 64:ff9b::a9fe:a9fe reaches 169.254.169.254
    on a network with a NAT64 gateway."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if any(address in prefix for prefix in _NAT64) and not any(address in n for n in _NOT_IPV4):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """What the relay may connect to. The default: everything but link-local and metadata."""

    strict: bool = False
    allow: tuple[Network, ...] = ()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> AddressPolicy:
        env = os.environ if environ is None else environ
        strict = env.get(STRICT_ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")
        return cls(strict=strict, allow=parse_networks(env.get(ALLOW_ENV_VAR, "")))

    def refusal(self, ip: str) -> str | None:
        """Why ``ip`` is refused (which rule, how to allow it), or None when it may be used."""
        address = _plain(ip)
        if any(address.version == n.version and address in n for n in self.allow):
            return None
        rules: Sequence[Rule] = ALWAYS_REFUSED + STRICT_REFUSED if self.strict else ALWAYS_REFUSED
        for rule in rules:
            if rule.matches(address):
                mode = "refused in strict mode" if rule not in ALWAYS_REFUSED else "always refused"
                return f"{address} is a {rule.name} ({mode}, to prevent SSRF); {_HOW_TO_ALLOW}"
        return None

    def describe(self) -> str:
        allowed = f", allowed: {', '.join(map(str, self.allow))}" if self.allow else ""
        mode = "strict (loopback, private, CGNAT, unspecified, multicast refused)" if self.strict else "default"
        return f"address policy {mode}; link-local and cloud-metadata refused{allowed}"


DEFAULT_POLICY = AddressPolicy()


async def allowed_addresses(host: str, port: int, policy: AddressPolicy = DEFAULT_POLICY) -> list[tuple[int, str]]:
    """(family, ip) of ``host`` that may be connected to; RefusedAddress if none."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    allowed: list[tuple[int, str]] = []
    reasons = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        reason = policy.refusal(ip)
        if reason is None:
            allowed.append((family, ip))
        else:
            reasons.append(reason)
    if not allowed:
        raise RefusedAddress(f"refused to connect to {host}: {reasons[0] if reasons else 'no address'}")
    return allowed
