"""Broker destinations as subscription URLs: parsed, validated, and their name templates rendered.

- ``nats://host[:4222]/<subject template>``: NATS JetStream (``delivery.jetstream``);
- ``redis://host[:6379][/<db>]?stream=<stream template>[&maxlen=N][&dedup_window=S]``:
  Redis Streams (``delivery.redis_streams``).

A template may use ``{stream}`` (the event's stream) and ``{key}`` (its key),
e.g. ``orders.{key}``, so that per-key subjects and streams work. In a NATS
subject the key becomes exactly one token: bytes other than letters, digits,
``-`` and ``_`` are percent-encoded (a key ``a.b`` gives ``a%2Eb``, never two
tokens or a wildcard); the stream name keeps its dots (``public.orders``
gives two tokens). An event without a key (or with an empty one) renders as
``_``. The exact key always travels in the message itself.

Credentials never go in the URL (``ferry.set_subscription_credentials``
stores them apart, like signing secrets), so a URL can be shown anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from pgferry.delivery.model import OutEvent

DEFAULT_NATS_PORT = 4222
DEFAULT_REDIS_PORT = 6379
#: JetStream's own default duplicate window; Redis keeps its deduplication marks as long.
DEFAULT_DEDUP_WINDOW_S = 120

#: a template's tokens: escaped braces, a placeholder, a stray brace, or text without braces
_TOKEN = re.compile(r"\{\{|\}\}|\{[^{}]*\}|[{}]|[^{}]+")
_TOKEN_SAFE = re.compile(r"[A-Za-z0-9_-]")
_SUBJECT_SAFE = re.compile(r"[A-Za-z0-9_.-]")


class BadDestination(ValueError):
    """The URL does not name a destination pgferry can deliver to; the message says why."""


@dataclass(frozen=True, slots=True)
class Template:
    """A name with ``{stream}`` and ``{key}`` placeholders; ``{{`` and ``}}`` are literal braces
    (a Redis Cluster ``{hash tag}`` is written ``?stream={{orders}}:{key}``)."""

    text: str
    #: the text cut into literal parts and placeholders (``("stream",)`` / ``("key",)``)
    parts: tuple[str | tuple[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts: list[str | tuple[str]] = []
        unknown: str | None = None
        stray = False
        literal = ""
        for match in _TOKEN.finditer(self.text):
            token = match.group()
            if token in ("{{", "}}"):
                literal += token[0]
            elif token in ("{stream}", "{key}"):
                parts += [literal, (token[1:-1],)]
                literal = ""
            elif token[0] == "{" and len(token) > 1:  # the first unknown one, as ferry._check_template names it
                unknown = unknown if unknown is not None else token
            elif token in ("{", "}"):
                stray = True
            else:
                literal += token
        if unknown is not None:
            raise BadDestination(f"unknown placeholder {unknown} in {self.text!r}; use {{stream}} or {{key}}")
        if stray:
            raise BadDestination(f"unbalanced braces in {self.text!r}; write a literal brace as {{{{ or }}}}")
        object.__setattr__(self, "parts", tuple(p for p in (*parts, literal) if p))

    @property
    def fixed(self) -> bool:
        """No placeholders: every event goes to one name (``name``)."""
        return all(isinstance(p, str) for p in self.parts)

    @property
    def name(self) -> str:
        """The name of a fixed template (its braces unescaped)."""
        return self.fill("", "")

    def fill(self, stream: str, key: str) -> str:
        """The name with these values, in one pass: a value that holds ``{key}`` stays as it is."""
        return "".join(p if isinstance(p, str) else stream if p[0] == "stream" else key for p in self.parts)

    def render(self, event: OutEvent, *, subject: bool) -> str:
        if self.fixed:
            return self.name
        stream = _encode(event.stream, _SUBJECT_SAFE) if subject else event.stream
        if subject and (stream.startswith(".") or stream.endswith(".") or ".." in stream):
            stream = stream.replace(".", "%2E")  # its dots would make an empty token: one token instead
        key = event.key or "_"
        if subject:
            key = _encode(key, _TOKEN_SAFE) if key != "_" else key
        return self.fill(stream, key)


def _encode(text: str, safe: re.Pattern[str]) -> str:
    return "".join(c if safe.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


@dataclass(frozen=True, slots=True)
class NatsDestination:
    host: str
    port: int
    subject: Template

    @property
    def address(self) -> str:
        return f"nats://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class RedisDestination:
    host: str
    port: int
    db: int
    stream: Template
    maxlen: int | None
    dedup_window_s: int

    @property
    def address(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"


def parse_nats(url: str) -> NatsDestination:
    parts = _split(url)
    if parts.username or parts.password:
        raise BadDestination("credentials do not go in the URL; set them with ferry.set_subscription_credentials")
    subject = unquote(parts.path.lstrip("/"))
    if not subject:
        raise BadDestination(f"{url!r} names no subject; use nats://host:4222/<subject>, e.g. orders.{{key}}")
    template = Template(subject)
    probe = template.fill("s", "k")
    if any(c.isspace() for c in probe) or any(t in ("", "*", ">") for t in probe.split(".")):
        raise BadDestination(f"{subject!r} is not a subject to publish to (no spaces, empty tokens or wildcards)")
    if probe.startswith(("$", "_INBOX.")):  # the server's commands ($JS.API...) and replies (ferry._check_url)
        raise BadDestination(f"{subject!r} is a subject of the NATS server itself, not one to publish events to")
    return NatsDestination(_host(parts.hostname, url), _port(parts, DEFAULT_NATS_PORT), template)


def parse_redis(url: str) -> RedisDestination:
    parts = _split(url)
    if parts.username or parts.password:
        raise BadDestination("credentials do not go in the URL; set them with ferry.set_subscription_credentials")
    path = parts.path.strip("/")
    if path and not (path.isascii() and path.isdigit()):  # "²" is a digit to str.isdigit, not to int()
        raise BadDestination(f"{path!r} is not a Redis database number; use redis://host:6379/0?stream=<name>")
    # A URL's query, not a form: "+" is a plus ("stream=orders+eu" was the key "orders eu"; outside
    # probe). A space is written %20.
    query = parse_qs(parts.query.replace("+", "%2B"), keep_blank_values=True)
    unknown = sorted(set(query) - {"stream", "maxlen", "dedup_window"})
    if unknown:
        raise BadDestination(f"unknown parameter {unknown[0]!r}; use stream=, maxlen= and dedup_window=")
    repeated = sorted(name for name, values in query.items() if len(values) > 1)
    if repeated:
        raise BadDestination(f"{repeated[0]!r} is given more than once")
    stream = query.get("stream", [""])[-1]
    if not stream:
        raise BadDestination(f"{url!r} names no stream; add ?stream=<name>, e.g. ?stream=orders:{{key}}")
    return RedisDestination(
        _host(parts.hostname, url),
        _port(parts, DEFAULT_REDIS_PORT),
        int(path or 0),
        Template(stream),
        _positive(query, "maxlen", None),
        _positive(query, "dedup_window", DEFAULT_DEDUP_WINDOW_S) or DEFAULT_DEDUP_WINDOW_S,
    )


def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"
        raise BadDestination(f"{url!r}: {exc}") from None


def _host(host: str | None, url: str) -> str:
    if not host:
        raise BadDestination(f"{url!r} names no host")
    return host


def _port(parts: object, default: int) -> int:
    try:
        port = parts.port  # type: ignore[attr-defined]
    except ValueError as exc:
        raise BadDestination(str(exc)) from None
    return int(port or default)


def _positive(query: dict[str, list[str]], name: str, default: int | None) -> int | None:
    if name not in query:
        return default
    value = query[name][-1]
    # Redis takes them as 64-bit, EXPIRE as seconds
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) < 2**31:
        raise BadDestination(f"{name}={value!r}: expected a whole number from 1 to {2**31 - 1}")
    return int(value)


def shown_url(url: str) -> str:
    """A subscription's URL as `subscription list`, `status` and `apply --dry-run` show it. A
    webhook's query string often carries a token: shown as "?…". A broker URL's says where its
    events go (stream, maxlen, dedup_window) and cannot hold credentials (refused): shown whole, or
    a change of stream showed as "?… -> ?…" (outside probe)."""
    if url.partition(":")[0].lower() in ("nats", "redis"):
        return url
    return re.sub(r"\?.*$", "?…", url)
