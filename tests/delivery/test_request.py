"""Turning events into a request (pure: no database, no network)."""

from __future__ import annotations

import json
from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgferry.delivery.model import OutEvent
from pgferry.delivery.request import PLAIN_KEY, build, key_header
from pgferry.delivery.signing import Signer
from tests.helpers import NOW, subscription

SUB = subscription()


def event(n: int, key: str | None = "k") -> OutEvent:
    return OutEvent(n, "s", key, f'{{"n": {n}}}', None, NOW)


def test_a_batch_subscription_sends_a_data_array_even_for_one_event() -> None:
    batched = replace(SUB, batch_size=10)
    for events in ([event(1)], [event(1), event(2)]):
        body = orjson.loads(build(batched, events, Signer(()), max_body_bytes=1 << 20).body)
        assert [item["payload"] for item in body["data"]] == [{"n": e.id} for e in events]
        assert [item["id"] for item in body["data"]] == [e.id for e in events]
    one = build(batched, [event(1)], Signer(()), max_body_bytes=1 << 20)
    assert "pgferry-key" not in one.headers and "pgferry-stream" not in one.headers  # per event: in the body
    single = build(SUB, [event(1)], Signer(()), max_body_bytes=1 << 20)
    assert orjson.loads(single.body) == {"n": 1} and single.headers["pgferry-key"] == "k"


@given(st.text(alphabet=st.characters(max_codepoint=0x300), max_size=12))
def test_a_key_goes_as_it_is_exactly_when_it_is_plain(key: str) -> None:
    if PLAIN_KEY.match(key):
        assert key_header(key) == (key, False)
    else:
        assert key_header(key)[1], "encoded"


@pytest.mark.parametrize(
    ("key", "header", "encoded"),
    [
        ("customer-7", "customer-7", False),
        ("two words", "two words", False),
        ("100%", "100%", False),
        ("a\x01b", "a%01b", True),
        ("line\r\nbreak", "line%0D%0Abreak", True),
        ("café", "caf%C3%A9", True),
        (" edge", "%20edge", True),
        ("100% \x7f", "100%25%20%7F", True),
        ("", "", True),
    ],
)
def test_a_key_header_is_printable_ascii_and_flags_its_encoding(key: str, header: str, encoded: bool) -> None:
    assert key_header(key) == (header, encoded)
    request = build(SUB, [event(1, key)], Signer(()), max_body_bytes=1 << 20)
    assert request.headers["pgferry-key"] == header
    assert request.headers.get("pgferry-key-encoding") == ("percent" if encoded else None)
    assert all(0x20 <= ord(c) < 0x7F for c in header)


def test_a_header_pgferry_sets_is_not_taken_from_a_subscription_saved_before_subscribe_refused_it() -> None:
    """ferry.subscribe refuses them (test_webhooks); an older subscription's is left out, not sent."""
    forged = {"Webhook-Signature": "v1,forged", "Host": "evil.example", "pgferry-key": "x", "X-Tenant": "acme"}
    for signer in (Signer(()), Signer(("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",))):
        request = build(replace(SUB, headers=forged), [event(1, key=None)], signer, max_body_bytes=1 << 20)
        assert "host" not in request.headers and "pgferry-key" not in request.headers
        assert request.headers["x-tenant"] == "acme"
        assert request.headers.get("webhook-signature", "") != "v1,forged"


def test_an_event_s_writer_overrides_none_of_the_subscription_s_headers_nor_the_connection_s() -> None:
    """A role holding only ferry_writer published `Authorization: Bearer attacker` and replaced
    the subscription's credential; `content-type: text/html` and `Connection: close` went too
    (outside probe). An event's other headers go as before."""
    sub = replace(SUB, headers={"Authorization": "Bearer receiver-secret"})
    forged = {"authorization": "Bearer attacker", "Content-Type": "text/html", "Connection": "close",
              "Keep-Alive": "timeout=1", "X-Trace": "t1"}  # fmt: skip
    mine = OutEvent(1, "s", "k", '{"n": 1}', json.dumps(forged), NOW)
    headers = build(sub, [mine], Signer(()), max_body_bytes=1 << 20).headers
    assert headers["authorization"] == "Bearer receiver-secret" and headers["content-type"] == "application/json"
    assert "connection" not in headers and "keep-alive" not in headers and headers["x-trace"] == "t1"


def test_an_event_s_writer_sets_neither_how_the_body_is_decoded_nor_who_sends_it() -> None:
    """An event's `Content-Encoding: gzip` went to the receiver with pgferry's plain JSON body (it
    would gunzip it, or refuse it), and its `User-Agent` replaced pgferry's (outside probe)."""
    forged = {"Content-Encoding": "gzip", "content-range": "bytes 0-1/2", "User-Agent": "curl/8", "X-Trace": "t1"}
    mine = OutEvent(1, "s", "k", '{"n": 1}', json.dumps(forged), NOW)
    headers = build(SUB, [mine], Signer(()), max_body_bytes=1 << 20).headers
    assert not {"content-encoding", "content-range", "user-agent"} & set(headers), headers
    assert headers["x-trace"] == "t1" and headers["content-type"] == "application/json"
    assert orjson.loads(build(SUB, [mine], Signer(()), max_body_bytes=1 << 20).body) == {"n": 1}  # as it is
