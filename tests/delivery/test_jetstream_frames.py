"""The JetStream sink's own HPUB frames and acknowledgement routing, held to nats-py's publish.

``delivery.brokers.AckedPublisher`` writes a chunk's frames itself and takes
acknowledgements off nats-py's parser (docs/benchmarks.md says why). Here a
real nats-server's JetStream stores what it received from both writers: the
same subjects, payloads and headers must come back, whatever the payload
bytes and header text.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgferry.bench.brokers import NatsServer
from pgferry.delivery import request
from pgferry.delivery.brokers import AckedPublisher, PublishRefused
from pgferry.delivery.destinations import NatsDestination, Template
from pgferry.delivery.jetstream import Message, _Messages, header_block, message_of
from pgferry.delivery.model import OutEvent
from tests.helpers import NOW, subscription

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=1, max_size=12)
HEADER_NAME = TOKEN.map(lambda name: "x-" + name)  # not one JetStream acts on (Nats-Expected-Stream, ...)
HEADER_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=40)
MESSAGE = st.tuples(
    st.lists(TOKEN, min_size=1, max_size=3).map(".".join),
    st.binary(max_size=600) | st.sampled_from([b"", b"\r\n", b"HPUB a b 1 2\r\n", b"\x00\xff" * 40]),
    st.dictionaries(HEADER_NAME, HEADER_VALUE, min_size=1, max_size=5),
)


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    nats_server = NatsServer()
    nats_server.start()
    yield nats_server
    nats_server.close()


async def _both_ways(url: str, messages: list[tuple[str, bytes, dict[str, str]]], fast: bool) -> tuple[Any, Any]:
    """What a JetStream stream stores of ``messages`` published by AckedPublisher and by nats-py's
    own publish (``js.publish``), read back in order; and AckedPublisher's outcomes. (Read back
    from the stream: a plain subscriber on another connection missed whole examples under load,
    with either writer.)"""
    client = await nats.connect(url)
    ours_client = await nats.connect(url)
    # A stream and subjects of this call's own: a message of an earlier example that a writer
    # re-sent after a reconnect landed in the next example's stream (a CI run under load).
    run = uuid.uuid4().hex[:12]
    stream = f"FRAMES_{run}"
    try:
        js = client.jetstream()
        await js.add_stream(name=stream, subjects=[f"{run}.ours.>", f"{run}.theirs.>"])
        publisher = AckedPublisher(ours_client)
        await publisher.start()
        assert publisher.fast, "nats-py's internals changed: the publisher fell back to per-message publish"
        publisher.fast = fast
        outcomes = await publisher.publish_all(
            [(f"{run}.ours.{s}", data, headers, header_block(headers)) for s, data, headers in messages], timeout=10
        )
        for s, data, headers in messages:
            await js.publish(f"{run}.theirs.{s}", data, headers=headers, timeout=10)
        last = (await js.stream_info(stream)).state.last_seq
        stored = [await js.get_msg(stream, seq) for seq in range(1, last + 1)]
        await js.delete_stream(stream)
        got = {who: [m for m in stored if (m.subject or "").startswith(f"{run}.{who}.")] for who in ("ours", "theirs")}
        return outcomes, got
    finally:
        for c in (client, ours_client):
            await c.close()


def _seen(msgs: list[Any]) -> list[tuple[str, bytes, dict[str, str] | None]]:
    """What the messages carry, in order, each once: a CI run stored four of one writer's messages
    twice (these carry no Nats-Msg-Id, which pgferry's always do; nats-py re-sends what it had not
    flushed when it reconnects, as under a loaded CI), and the comparison is of what frames carry."""
    seen: list[tuple[str, bytes, dict[str, str] | None]] = []
    for m in msgs:
        item = (m.subject.split(".", 2)[2], m.data, m.headers)  # without the run and the writer
        if item not in seen:
            seen.append(item)
    return seen


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGE, min_size=1, max_size=30))
def test_frames_carry_what_nats_pys_publish_carries(
    server: NatsServer, messages: list[tuple[str, bytes, dict[str, str]]]
) -> None:
    outcomes, got = asyncio.run(_both_ways(server.url, messages, fast=True))
    assert outcomes == [None] * len(messages)  # each acknowledged by JetStream
    assert _seen(got["ours"]) == _seen(got["theirs"])
    assert len(_seen(got["ours"])) == len({(s, d, tuple(sorted(h.items()))) for s, d, h in messages})


async def test_without_nats_pys_internals_the_public_publish_gives_the_same_messages_and_outcomes(
    server: NatsServer,
) -> None:
    messages = [("a.b", b'{"x": 1}', {"x-id": "1", "x-text": " padded  "}), ("c", b"", {"x-n": "\u00e9t\u00e9"})]
    for fast in (True, False):
        outcomes, got = await _both_ways(server.url, messages, fast=fast)
        assert outcomes == [None, None]
        assert _seen(got["ours"]) == _seen(got["theirs"])


async def test_a_chunk_larger_than_one_write_goes_out_whole_and_in_order(server: NatsServer) -> None:
    messages = [(f"big.{n}", bytes([n]) * 150_000, {"x-n": str(n)}) for n in range(6)]  # 900 KB: four writes
    outcomes, got = await _both_ways(server.url, messages, fast=True)
    assert outcomes == [None] * 6
    assert _seen(got["ours"]) == _seen(got["theirs"]) and len(got["ours"]) == 6


async def test_each_message_of_a_chunk_gets_its_own_outcome(server: NatsServer) -> None:
    client = await nats.connect(server.url)
    try:
        js = client.jetstream()
        await js.add_stream(name="ONE", subjects=["kept.>"])
        for fast in (True, False):
            publisher = AckedPublisher(client)
            await publisher.start()
            publisher.fast = publisher.fast and fast
            headers = {"x-a": "1"}
            block = header_block(headers)
            outcomes = await publisher.publish_all(
                [
                    ("kept.1", b"1", headers, block),
                    ("nobody.listens", b"2", headers, block),
                    ("kept.2", b"3", headers, block),
                ],
                timeout=5,
            )
            assert outcomes[0] is None and outcomes[2] is None
            assert isinstance(outcomes[1], PublishRefused) and outcomes[1].no_stream
    finally:
        await client.close()


async def test_an_answer_that_is_not_a_jetstream_acknowledgement_is_no_stream_not_stored(server: NatsServer) -> None:
    """A core NATS service answering on the subject: any JSON was taken as stored (outside probe)."""
    client = await nats.connect(server.url)
    try:

        async def answer(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b"{}" if msg.subject == "svc.json" else b"pong")

        await client.subscribe("svc.*", cb=answer)
        for fast in (True, False):
            publisher = AckedPublisher(client)
            await publisher.start()
            publisher.fast = publisher.fast and fast
            block = header_block({})
            outcomes = await publisher.publish_all(
                [("svc.json", b"1", {}, block), ("svc.text", b"2", {}, block)], timeout=5
            )
            assert all(isinstance(o, PublishRefused) and o.no_stream for o in outcomes), outcomes
            assert "not JetStream" in str(outcomes[0])
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"bad name": "x"}, "not a valid NATS header name"),
        ({"x-a": "one\r\ntwo"}, "line break"),
        ({"x-a": "one\ntwo"}, "line break"),
    ],
)
def test_a_header_that_would_break_the_frame_is_refused(headers: dict[str, str], problem: str) -> None:
    with pytest.raises(request.BadRequest, match=problem):
        header_block(headers)


TEXT = st.text(st.characters(max_codepoint=0x2FF), max_size=6) | st.sampled_from(["a b", " x", "y ", "c\r\nd", "\t"])


@settings(max_examples=300, deadline=None)
@given(
    name=TEXT.filter(bool),
    sub_headers=st.dictionaries(
        st.sampled_from(["x-a", "X-B", "webhook-id", "pgferry-key", "Nats-Msg-Id", "bad name"]), TEXT, max_size=3
    ),
    template=st.sampled_from(["orders", "orders.{key}", "{stream}.{key}", "{stream}", "two words", ""]),
    events=st.lists(
        st.tuples(
            st.integers(1, 10**15),
            st.sampled_from(["public.t", " s ", "a\nb", "x.y", ".lead", "é"]),
            st.none() | TEXT,
            st.none()
            | st.sampled_from(
                ['{"x-h": "v"}', "{}", '{"webhook-id": "w"}', '{"bad name": "v"}', '{"NATS-Rollup": "all"}']
            ),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_messages_made_once_per_subscription_are_those_message_of_makes(
    name: str, sub_headers: dict[str, str], template: str, events: list[tuple[int, str, str | None, str | None]]
) -> None:
    """_Messages works out what every event of a subscription shares once; event by event it
    must give what message_of gives, or refuse with the same reason."""
    sub = subscription(name=name, headers=sub_headers)
    dest = NatsDestination("127.0.0.1", 4222, Template(template))
    make = _Messages(sub, dest)
    for event_id, stream, key, headers in events:
        event = OutEvent(event_id, stream, key, '{"n": 1}', headers, NOW)
        try:
            expected: Message | str = message_of(sub, dest, event)
        except request.BadRequest as exc:
            expected = str(exc)
        try:
            got: Message | str = make(event)
        except request.BadRequest as exc:
            got = str(exc)
        assert got == expected


def test_a_header_pgferry_sets_is_not_taken_from_a_subscription_saved_before_subscribe_refused_it() -> None:
    """ferry.subscribe refuses them (any case); an older subscription's are left out, on both paths."""
    legacy = {"Webhook-Signature": "forged", "NATS-MSG-ID": "mine", "Pgferry-Stream": "x", "X-Ok": "1"}
    sub = subscription(name="s", headers=legacy)
    dest = NatsDestination("127.0.0.1", 4222, Template("orders.{key}"))
    event = OutEvent(7, "public.orders", "k", '{"n": 1}', None, NOW)
    for message in (message_of(sub, dest, event), _Messages(sub, dest)(event)):
        assert {k.lower(): v for k, v in message.headers.items()} == {
            "x-ok": "1", "webhook-id": "evt_7", "pgferry-stream": "public.orders", "pgferry-key": "k",
            "nats-msg-id": "s/evt_7",
        }  # fmt: skip


def test_an_event_s_writer_sets_no_header_jetstream_acts_on_nor_one_pgferry_sets() -> None:
    """`ferry.publish(..., headers => '{"Nats-Rollup": "all"}')` purged the JetStream stream of
    every earlier message; a keyless event's `pgferry-key` arrived as its key (outside probe)."""
    sub = subscription(name="s", headers={"Nats-TTL": "1h"})  # an operator's own may
    dest = NatsDestination("127.0.0.1", 4222, Template("orders"))
    forged = '{"Nats-Rollup": "all", "nats-expected-last-sequence": "1", "pgferry-key": "forged", "X-App": "1"}'
    event = OutEvent(7, "public.orders", None, '{"n": 1}', forged, NOW)
    for message in (message_of(sub, dest, event), _Messages(sub, dest)(event)):
        assert {k.lower(): v for k, v in message.headers.items()} == {
            "nats-ttl": "1h", "x-app": "1", "webhook-id": "evt_7", "pgferry-stream": "public.orders",
            "nats-msg-id": "s/evt_7",
        }  # fmt: skip


@pytest.mark.parametrize(("template", "stream", "key"), [("{stream}", "_INBOX.abc", "k"), ("{key}.x", "s", "_INBOX")])
def test_a_template_rendering_a_reply_subject_of_the_server_is_refused_like_the_literal(
    template: str, stream: str, key: str
) -> None:
    """`_INBOX.x` written in the URL is refused at subscribe; rendered from a stream or key it was
    published to (outside probe): a bad_request dead letter with the reason, on both paths."""
    sub = subscription(name="s")
    dest = NatsDestination("127.0.0.1", 4222, Template(template))
    event = OutEvent(7, stream, key, '{"n": 1}', None, NOW)
    for make in (lambda e: message_of(sub, dest, e), _Messages(sub, dest)):
        with pytest.raises(request.BadRequest, match="a subject of the NATS server itself"):
            make(event)
