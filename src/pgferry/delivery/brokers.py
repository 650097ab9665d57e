"""The relay's connections to message brokers, one per broker and set of credentials.

Every subscription of a relay that publishes to the same broker with the
same credentials shares one connection, made on first use and checked
against the relay's address policy (``delivery.addresses``) like a webhook's.
A connection that cannot be made is an attempt that failed (error class
``connect`` or ``auth``), retried like any other; the clients' own retries
are off, so that every try that reached the wire is an attempt the engine
sees.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from pgferry.delivery import nats_creds
from pgferry.delivery.addresses import DEFAULT_POLICY, AddressPolicy, RefusedAddress, allowed_addresses
from pgferry.delivery.fasthttp import tls_reason
from pgferry.delivery.redis_pipe import RedisError, RedisPipe

if TYPE_CHECKING:
    import nats.aio.client

log = logging.getLogger(__name__)

#: Seconds a broker connection may take to be made.
CONNECT_TIMEOUT_S = 5.0

ClientKey = tuple[str, str, int, int, tuple[tuple[str, str], ...]]


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:4222``, not ``::1:4222``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BrokerUnreachable(Exception):
    """No connection to the broker: ``error_class`` is ``connect``, ``auth``, ``tls`` or ``refused_address``."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class PublishRefused(Exception):
    """JetStream answered a publish with an error (``no_stream`` when nothing captures the subject)."""

    def __init__(self, no_stream: bool, err_code: int | None, description: str) -> None:
        super().__init__(description)
        self.no_stream = no_stream
        self.err_code = err_code
        self.description = description


#: The subject prefix of JetStream's API (the account's own; no domain).
JS_API = "$JS.API"

#: Bytes of frames joined into one write at most.
FRAMES_AT_ONCE = 1 << 18

#: What a publish is handed: subject, payload, headers, and the headers as a NATS/1.0 block
#: (``jetstream.header_block``).
Publish = tuple[str, bytes, Mapping[str, str], bytes]


class AckedPublisher:
    """Publishes chunks to JetStream and waits for every message's acknowledgement.

    nats-py's ``js.publish`` makes one request per message and waits for its answer
    (~10,600 acknowledged messages/s here, a chunk of 100 at a time). Here a chunk's
    messages go out together, each with its own reply subject ``<inbox>.<chunk>-<i>``
    on one wildcard subscription of this connection, and the chunk waits for all of
    its acknowledgements at once.

    The connection (login, TLS, PING/PONG, parsing what the server sends) is nats-py's.
    Two steps of its per-message path cost more than the rest of the relay's work for
    an event, so they are done here, where nats-py's internals allow (``fast``):

    * the chunk's ``HPUB`` frames (``HPUB <subject> <reply> <header bytes> <total
      bytes>``, CRLF, the header block, the payload, CRLF) are
      written as one buffer into nats-py's outgoing queue (``_send_command``), in
      place of one ``publish`` call per message, each re-checking and re-encoding
      the headers;
    * acknowledgements are taken off the parser's hand-over (``_process_msg``) for
      this one subscription, in place of a message object, a queue and a callback
      task per acknowledgement.

    Per message, the relay's CPU went from ~16 to ~6 µs (docs/benchmarks.md); the
    frames are held to nats-py's own publish by a property test against a real
    nats-server (tests/delivery/test_jetstream_frames.py). Should a nats-py release
    lack those internals, the public ``publish`` and a subscription callback are used
    instead (same replies, same outcomes).
    """

    def __init__(self, client: nats.aio.client.Client) -> None:
        self.client = client
        self.prefix = client.new_inbox() + "."
        self._prefix_bytes = self.prefix.encode()
        self._chunks: dict[bytes, _Chunk] = {}
        self.sequence = 0
        #: frames and acknowledgements go around nats-py's per-message path (see above)
        self.fast = False

    async def start(self) -> None:
        subscription = await self.client.subscribe(self.prefix + "*", cb=self._acknowledged)
        self.fast = _hook_acknowledgements(self.client, subscription, len(self._prefix_bytes), self._acknowledge)

    async def _acknowledged(self, msg: Any) -> None:
        """nats-py's callback, for acknowledgements the hook did not take."""
        status = b"NATS/1.0 503" if msg.headers and msg.headers.get("Status") == "503" else None
        self._acknowledge(msg.subject.encode()[len(self._prefix_bytes) :], msg.data, status)

    def _acknowledge(self, token: bytes, data: bytes, headers: bytes | None) -> None:
        chunk_id, _, index = token.partition(b"-")
        chunk = self._chunks.get(chunk_id)
        if chunk is None or not index.isdigit() or int(index) >= len(chunk.answers):
            return  # a chunk given up on (timed out), or not ours
        i = int(index)
        if chunk.answers[i] is None:
            chunk.answers[i] = (data, headers)
            chunk.left -= 1
            if chunk.left == 0 and not chunk.done.done():
                chunk.done.set_result(None)

    async def publish_all(self, messages: Sequence[Publish], timeout: float) -> list[BaseException | None]:
        """Per message: None (stored, or a duplicate JetStream dropped), or what went wrong."""
        import nats.errors  # noqa: PLC0415

        client = self.client
        if not client.is_connected:  # closed, or not yet reconnected: nats-py's publish refuses too
            raise nats.errors.ConnectionClosedError
        self.sequence += 1
        chunk_id = str(self.sequence).encode()
        chunk = _Chunk([None] * len(messages), len(messages), asyncio.get_running_loop().create_future())
        self._chunks[chunk_id] = chunk
        reply = self._prefix_bytes + chunk_id + b"-"
        try:
            if self.fast:
                frames: list[bytes] = []
                size = 0
                for i, (subject, data, _, block) in enumerate(messages):
                    frame = b"HPUB %b %b%d %d %d\r\n%b%b\r\n" % (
                        subject.encode(),
                        reply,
                        i,
                        len(block),
                        len(block) + len(data),
                        block,
                        data,
                    )
                    frames.append(frame)
                    size += len(frame)
                    if size >= FRAMES_AT_ONCE or i == len(messages) - 1:  # large messages: no copy of the whole chunk
                        await client._send_command(b"".join(frames))
                        frames, size = [], 0
                if client._flush_queue is not None and client._flush_queue.empty():
                    await client._flush_pending()  # as nats-py's publish ends
            else:
                for i, (subject, data, headers, _) in enumerate(messages):
                    await client.publish(subject, data, reply=f"{reply.decode()}{i}", headers=dict(headers))
            if messages:
                await asyncio.wait([chunk.done], timeout=timeout)
        finally:
            del self._chunks[chunk_id]
        return [_ack_outcome(answer) for answer in chunk.answers]

    async def stream_capturing(self, subject: str, timeout: float) -> tuple[str, Mapping[str, Any]] | None:
        """The name and configuration of the JetStream stream that captures ``subject``, asked on
        this connection (``STREAM.NAMES`` filtered by the subject, then ``STREAM.INFO``): what a
        publish left unacknowledged is explained by (``jetstream._unacknowledged``). None when no
        stream does, or JetStream does not say within ``timeout`` each (a frozen server, a user
        not allowed its API)."""
        names = await self._api(f"{JS_API}.STREAM.NAMES", orjson.dumps({"subject": subject}), timeout)
        streams = names.get("streams") if names is not None else None
        if not (isinstance(streams, list) and streams and isinstance(streams[0], str)):
            return None
        info = await self._api(f"{JS_API}.STREAM.INFO.{streams[0]}", b"", timeout)
        config = info.get("config") if info is not None else None
        return (streams[0], config) if isinstance(config, dict) else None

    async def _api(self, subject: str, body: bytes, timeout: float) -> dict[str, Any] | None:
        """JetStream's JSON answer to a request of its API, or None (no answer, or not an object)."""
        import nats.errors  # noqa: PLC0415

        try:
            answer = orjson.loads((await self.client.request(subject, body, timeout=timeout)).data)
        except (nats.errors.Error, TimeoutError, OSError, orjson.JSONDecodeError):
            return None
        return answer if isinstance(answer, dict) else None


@dataclass
class _Chunk:
    """A chunk's acknowledgements as they come: (data, raw header block) per message."""

    answers: list[tuple[bytes, bytes | None] | None]
    left: int
    done: asyncio.Future[None]


#: nats-py's hand-over of each message the server sends (nats.protocol.parser), as of nats-py 2.x.
_PROCESS_MSG_PARAMETERS = ["sid", "subject", "reply", "data", "headers"]


def _hook_acknowledgements(
    client: nats.aio.client.Client, subscription: Any, skip: int, take: Callable[[bytes, bytes, bytes | None], None]
) -> bool:
    """Routes the messages of ``subscription`` to ``take(subject[skip:], data, raw headers)`` before
    nats-py builds a message object for each; False (nothing changed) where this nats-py differs."""
    original = getattr(client, "_process_msg", None)
    sid = getattr(subscription, "_id", None)
    if original is None or not isinstance(sid, int) or not hasattr(client, "_send_command"):
        return False
    if list(inspect.signature(original).parameters) != _PROCESS_MSG_PARAMETERS:
        return False

    async def process_msg(msg_sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if msg_sid == sid:
            take(bytes(subject[skip:]), data, headers)
        else:
            await original(msg_sid, subject, reply, data, headers)

    client._process_msg = process_msg  # type: ignore[method-assign,assignment]
    return True


def _ack_outcome(answer: tuple[bytes, bytes | None] | None) -> BaseException | None:
    if answer is None:
        return TimeoutError()
    data, headers = answer
    if headers is not None and headers[9:12] == b"503":  # "NATS/1.0 503": no stream captures the subject
        return PublishRefused(True, None, "no responders")
    try:
        ack = orjson.loads(data)
    except orjson.JSONDecodeError:
        ack = None
    error = ack.get("error") if isinstance(ack, dict) else None
    if isinstance(error, dict):
        return PublishRefused(False, error.get("err_code"), str(error.get("description") or error))
    if not (isinstance(ack, dict) and isinstance(ack.get("stream"), str) and isinstance(ack.get("seq"), int)):
        # A service that is not JetStream answered on the subject: any JSON was taken as stored,
        # and events no stream held were recorded as delivered (outside probe).
        return PublishRefused(True, None, f"answered by something that is not JetStream: {data[:200]!r}")
    return None


class Brokers:
    def __init__(self, policy: AddressPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self._clients: dict[ClientKey, asyncio.Future[Any]] = {}
        self._closing: set[asyncio.Future[None]] = set()

    async def _client(self, key: ClientKey, make: Callable[[str], Awaitable[Any]], alive: Callable[[Any], bool]) -> Any:
        future = self._clients.get(key)
        if future is not None and future.done() and (future.exception() is not None or not alive(future.result())):
            del self._clients[key]
            future = None
        if future is None:
            future = self._clients[key] = asyncio.ensure_future(self._connect(key, make))
        return await asyncio.shield(future)

    async def _connect(self, key: ClientKey, make: Callable[[str], Awaitable[Any]]) -> Any:
        host, port = key[1], key[2]
        try:
            addresses = await allowed_addresses(host, port, self.policy)
        except RefusedAddress as exc:
            raise BrokerUnreachable("refused_address", str(exc)) from None
        except OSError as exc:
            raise BrokerUnreachable("dns", f"cannot resolve {host}: {exc}") from None
        ip = addresses[0][1]
        try:
            async with asyncio.timeout(2 * CONNECT_TIMEOUT_S):  # however the client retries inside
                return await make(f"[{ip}]" if ":" in ip else ip)
        except TimeoutError:
            raise BrokerUnreachable(
                "connect", f"no connection to {host_port(host, port)} within {2 * CONNECT_TIMEOUT_S:g} s"
            ) from None

    async def jetstream(self, host: str, port: int, credentials: Mapping[str, str]) -> AckedPublisher:
        import nats  # noqa: PLC0415 - loaded by relays that publish to NATS only
        import nats.errors  # noqa: PLC0415

        async def make(ip: str) -> AckedPublisher:
            options: dict[str, Any] = {}
            if "token" in credentials:
                options["token"] = credentials["token"]
            if "user" in credentials:
                options["user"], options["password"] = credentials["user"], credentials.get("password", "")
            if "creds_file" in credentials:  # read and checked here: nats-py could hang on it (nats_creds)
                try:
                    options.update(await nats_creds.connect_options(credentials["creds_file"]))
                except nats_creds.BadCredentials as exc:
                    raise BrokerUnreachable("config", str(exc)) from None

            async def quiet(exc: Exception) -> None:  # failed publishes say what matters
                log.debug("NATS %s:%d: %s", host, port, exc)

            try:
                client = await nats.connect(
                    f"nats://{ip}:{port}",
                    connect_timeout=CONNECT_TIMEOUT_S,
                    # No reconnecting inside the client: it would hold publishes in its buffer and keep
                    # retrying a refused login; a closed connection is made anew by the next send.
                    allow_reconnect=False,
                    max_reconnect_attempts=1,  # nats-py's first connect tries this many servers (0: forever)
                    reconnect_time_wait=0.1,
                    error_cb=quiet,
                    name="pgferry relay",
                    **options,
                )
            except ssl.SSLError as exc:  # the server requires TLS (nats-py's default context): as a webhook's
                raise BrokerUnreachable(
                    "tls", f"TLS error with NATS at {host_port(host, port)}: {tls_reason(exc)}"
                ) from None
            except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__  # a timeout says nothing itself
                raise BrokerUnreachable(
                    "connect", f"cannot connect to NATS at {host_port(host, port)}: {why}"
                ) from None
            except nats.errors.Error as exc:
                text = str(exc)
                auth = "authorization" in text.lower() or "auth" in type(exc).__name__.lower()
                raise BrokerUnreachable(
                    "auth" if auth else "connect", f"NATS at {host_port(host, port)}: {text}"
                ) from None
            publisher = AckedPublisher(client)
            await publisher.start()
            return publisher

        key = ("nats", host, port, 0, tuple(sorted(credentials.items())))
        return await self._client(key, make, lambda p: not p.client.is_closed)  # type: ignore[no-any-return]

    async def redis(self, host: str, port: int, db: int, credentials: Mapping[str, str]) -> RedisPipe:
        async def make(ip: str) -> RedisPipe:
            try:
                return await RedisPipe.connect(ip, port, db, credentials)
            except RedisError as exc:
                # The server answered: not down, unless it cannot serve yet (LOADING after a restart:
                # thousands of attempts a second were recorded as config, outside probe). Wrong
                # credentials, or this subscription's setting (a database number the server does not
                # have), which held every other one back.
                error_class = {"auth": "auth", "unready": "connect"}.get(exc.kind, "config")
                raise BrokerUnreachable(error_class, f"Redis at {host_port(host, port)}: {exc}") from None
            except OSError as exc:
                raise BrokerUnreachable(
                    "connect", f"cannot connect to Redis at {host_port(host, port)}: {exc}"
                ) from None

        key = ("redis", host, port, db, tuple(sorted(credentials.items())))
        return await self._client(key, make, lambda pipe: pipe.alive)  # type: ignore[no-any-return]

    def forget(self, scheme: str, host: str, port: int) -> None:
        """Drop the broker's connections (it was just marked down): the next send connects anew."""
        for key in [k for k in self._clients if k[:3] == (scheme, host, port)]:
            future = self._clients.pop(key)
            if future.done() and future.exception() is None:
                closing = asyncio.ensure_future(_close(future.result()))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        futures, self._clients = list(self._clients.values()), {}
        for future in futures:
            if future.done() and future.exception() is None:
                await _close(future.result())
            else:
                future.cancel()


async def _close(client: Any) -> None:
    try:
        if isinstance(client, AckedPublisher):
            await client.client.close()
        else:
            client.close()
    except Exception as exc:  # noqa: BLE001 - closing a broken connection: nothing to do about it
        log.debug("closing a broker connection: %s", exc)
