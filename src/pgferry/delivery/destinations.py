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
from urllib.parse import SplitResult, unquote, urlsplit

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
        return f"nats://{_bracketed(self.host)}:{self.port}"


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
        return f"redis://{_bracketed(self.host)}:{self.port}/{self.db}"


#: The highest Redis database number a server can have (its ``databases`` setting is at most 2^31 - 1).
MAX_REDIS_DB = 2**31 - 2
#: A query parameter's name that an error message may repeat (a word, not a secret's shape).
_SHOWN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")

NO_CREDENTIALS = "the URL holds a user or password (not repeated here); credentials do not go in the URL"


def shown_in_error(url: str) -> str:
    """``url`` as refusals show it: a query string or fragment as "?…" (it may hold a secret);
    ferry._check_url shows it the same."""
    cut = re.search(r"[?#]", url)
    return url if cut is None else url[: cut.start()] + "?…"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_nats(url: str) -> NatsDestination:
    """The refusals are ferry._check_url's, word for word (tests/delivery/test_destinations.py)."""
    parts = _split(url)
    if parts.username or parts.password:
        raise BadDestination(NO_CREDENTIALS)
    host = _host(parts.hostname, url, "nats://host:4222/<subject>")
    if "?" in url or "#" in url:
        raise BadDestination(
            f"{shown_in_error(url)!r}: a NATS URL takes no query string or fragment (not repeated here); "
            "use nats://host:4222/<subject>"
        )
    subject = unquote(parts.path.lstrip("/"))
    if not parts.path.lstrip("/") or "/" in parts.path.lstrip("/"):
        raise BadDestination(
            f"{url!r} names no subject to publish to; use nats://host:4222/<subject>, e.g. orders.{{key}}"
        )
    template = Template(subject)
    probe = template.fill("s", "k")
    if any(c.isspace() for c in probe) or any(t in ("", "*", ">") for t in probe.split(".")):
        raise BadDestination(f"{subject!r} is not a subject to publish to (no spaces, empty tokens or wildcards)")
    if probe.startswith(("$", "_INBOX.")):  # the server's commands ($JS.API...) and replies (ferry._check_url)
        raise BadDestination(f"{subject!r} is a subject of the NATS server itself, not one to publish events to")
    return NatsDestination(host, _port(parts, url, DEFAULT_NATS_PORT), template)


def parse_redis(url: str) -> RedisDestination:
    """The refusals are ferry._check_url's, word for word (tests/delivery/test_destinations.py)."""
    parts = _split(url)
    if parts.username or parts.password:
        raise BadDestination(NO_CREDENTIALS)
    host = _host(parts.hostname, url, "redis://host:6379/<db>?stream=<name>")
    path = parts.path.strip("/")
    if path and not (path.isascii() and path.isdigit()):  # "²" is a digit to str.isdigit, not to int()
        raise BadDestination(f"{path!r} is not a Redis database number; use redis://host:6379/0?stream=<name>")
    if path and int(path) > MAX_REDIS_DB:  # taken, and every attempt failed as config (outside probe)
        raise BadDestination(f"{path!r} is not a Redis database number: a server has at most {MAX_REDIS_DB + 1} "
                             "(its databases setting, 16 by default)")  # fmt: skip
    # The parameters as ferry._check_url reads them: names as written, values percent-decoded as a
    # URL's, not a form's ("+" is a plus: "stream=orders+eu" was the key "orders eu"; outside probe).
    pairs = [p.partition("=") for p in parts.query.split("&") if p]
    for name, equals, _ in pairs:
        if name not in ("stream", "maxlen", "dedup_window"):
            raise BadDestination(_unknown_parameter(name, bool(equals)))
    names = [name for name, _, _ in pairs]
    for name in names:
        if names.count(name) > 1:
            raise BadDestination(f"{name!r} is given more than once")
    query = {name: unquote(value) for name, _, value in pairs}
    stream = query.get("stream", "")
    if not stream:
        raise BadDestination(
            f"{shown_in_error(url)!r} names no Redis stream; add ?stream=<name>, e.g. ?stream=orders:{{key}}"
        )
    template = Template(stream)
    maxlen = _positive(query, "maxlen", None)
    window = _positive(query, "dedup_window", DEFAULT_DEDUP_WINDOW_S) or DEFAULT_DEDUP_WINDOW_S
    return RedisDestination(host, _port(parts, url, DEFAULT_REDIS_PORT), int(path or 0), template, maxlen, window)


def _unknown_parameter(name: str, has_value: bool) -> str:
    """An unknown parameter's refusal: it names the parameter when it looks like a name (the name
    of ``password=...``, never the value); anything else may be a secret: not repeated."""
    if has_value and _SHOWN_NAME.fullmatch(name):
        return f"unknown Redis parameter {name!r}; use stream=, maxlen= and dedup_window="
    return "a Redis URL parameter other than stream=, maxlen= and dedup_window= (not repeated here)"


def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"
        raise BadDestination(f"{url!r}: {exc}") from None


def _host(host: str | None, url: str, use: str) -> str:
    if not host:  # nats:///orders was "names no subject", redis:///0?stream=x "names no Redis stream"
        raise BadDestination(f"{shown_in_error(url)!r} names no host; use {use}")
    return host


def _port(parts: SplitResult, url: str, default: int) -> int:
    """The port, refused in ferry._check_url's words (urllib's were "Port out of range 0-65535")."""
    written = re.match(r"[^:/?#]*://(\[[^\]]*\]|[^/?#:]*)(?::([^/?#]*))?", url)
    port = written.group(2) if written is not None else None
    if port is None:
        return default
    if not (port.isascii() and port.isdigit()) or not 1 <= len(port) <= 5:
        raise BadDestination(f"malformed URL {shown_in_error(url)!r}")
    if not 1 <= int(port) <= 65535:
        raise BadDestination(f"{shown_in_error(url)!r} has a port out of range (1-65535)")
    return int(port)


def _positive(query: dict[str, str], name: str, default: int | None) -> int | None:
    if name not in query:
        return default
    value = query[name]
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
