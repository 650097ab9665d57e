"""Stream patterns of API tokens, the token format and the Authorization header: pure, no database."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgferry.api_tokens import (
    PatternSet,
    bearer_from_header,
    check_pattern,
    check_patterns,
    hash_token,
    matches,
    new_token,
)
from pgferry.errors import InvalidTokenPattern


def test_a_star_matches_any_run_of_characters_dots_and_colons_included() -> None:
    assert matches("orders.*", "orders.eu")
    assert matches("orders.*", "orders.")
    assert matches("orders.*", "orders.eu:shard:1.x")
    assert not matches("orders.*", "orders")
    assert matches("*:audit", "tenant.7:billing:audit")
    assert matches("a*b*c", "abc") and matches("a*b*c", "a-b-b-c") and not matches("a*b*c", "a-c-b")
    assert matches("**", "") and matches("a**", "a")


def test_a_question_mark_matches_exactly_one_character() -> None:
    assert matches("public.?rders", "public.orders")
    assert matches("public.?rders", "public.Ärders")
    assert not matches("public.?rders", "public.rders")
    assert not matches("public.?rders", "public.oorders")
    assert matches("??", "ab") and not matches("??", "a") and not matches("??", "abc")
    assert matches("a?*?c", "abbc") and not matches("a?*?c", "abc")


def test_everything_else_is_literal_and_case_sensitive() -> None:
    for literal in ("[ab]", "{a,b}", "a|b", "a.b", "(x)+", "^$", "a\\*", "%", "a_b", "ö", "a b"):
        assert matches(literal, literal), literal
    assert not matches("[ab]", "a")
    assert not matches("{a,b}", "a")
    assert not matches("a.b", "axb")
    assert not matches("%", "anything")
    assert matches("a\\*", "a\\b") and not matches("a\\*", "a*")  # a backslash escapes nothing: it is literal
    assert not matches("Orders", "orders") and not matches("orders.*", "ORDERS.eu")


def test_a_star_alone_is_every_stream() -> None:
    every = PatternSet(["*"])
    assert all(s in every for s in ("", "x", "public.orders", "a:b:c", "ö\u2028"))
    assert "x" not in PatternSet([])


def test_a_token_may_what_any_of_its_patterns_allows() -> None:
    patterns = PatternSet(["billing", "orders.*", "tenant-?"])
    assert {s for s in ("billing", "billing2", "orders.eu", "order", "tenant-1", "tenant-12") if s in patterns} == {
        "billing", "orders.eu", "tenant-1",
    }  # fmt: skip


def _as_regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


@given(st.text("ab.:*?[", max_size=12), st.text("ab.:?*[", max_size=16))
def test_matching_agrees_with_a_regex_translation_of_the_pattern(pattern: str, stream: str) -> None:
    expected = re.fullmatch(_as_regex(pattern), stream, re.DOTALL) is not None
    assert matches(pattern, stream) is expected
    assert (stream in PatternSet([pattern])) is expected


def test_a_hostile_stream_name_does_not_make_a_pattern_of_many_stars_backtrack() -> None:
    """As a regex, .*a.*a.*a.*a.*a.*b takes 1.8 s on 100 a's (measured) and doubles with each one more;
    the segment matcher takes each segment's leftmost place once."""
    stream = "a" * 100_000
    started = time.perf_counter()
    for pattern in ("*a" * 99 + "*b", "*a" * 98 + "*b*", "*a?" * 65 + "*b*", "*a" * 5 + "*b"):
        assert len(pattern) <= 200
        assert not matches(pattern, stream), pattern
    assert matches("*a" * 99 + "*", stream)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("", "read pattern #1 is empty"),
        ("   ", "read pattern #1 is empty"),
        ("x" * 201, "is 201 characters long; the limit is 200"),
        ("orders\n", "holds a control character"),
        ("a\tb", "holds a control character"),
        ("a\x00", "holds a control character"),
        ("a\x7f", "holds a control character"),
        ("a\x85", "holds a control character"),
    ],
)
def test_a_bad_pattern_is_refused_with_what_is_wrong_with_it(pattern: str, says: str) -> None:
    with pytest.raises(InvalidTokenPattern, match=re.escape(says)):
        check_pattern(pattern)


def test_patterns_that_are_fine() -> None:
    check_patterns(["*", "x" * 200, "a b", "ö.*", "[x]", "{a,b}", "?"], "write")
    with pytest.raises(InvalidTokenPattern, match="write pattern #2 is empty"):
        check_patterns(["ok", ""], "write")
    with pytest.raises(InvalidTokenPattern, match="at most 100 read patterns, got 101"):
        check_patterns(["a"] * 101)


def test_a_new_token_is_pft_and_32_random_bytes_and_its_hash_is_its_sha256() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert re.fullmatch(r"pft_[A-Za-z0-9_-]{43}", token), token
    token = tokens.pop()
    assert hash_token(token) == hashlib.sha256(token.encode()).digest()
    assert len(hash_token(token)) == 32


def test_the_token_of_an_authorization_header() -> None:
    token = new_token()
    assert bearer_from_header(f"Bearer {token}") == token
    assert bearer_from_header(f"bearer  {token} ") == token
    assert bearer_from_header(None) is None
    assert bearer_from_header("") is None
    assert bearer_from_header(f"Basic {token}") is None
    assert bearer_from_header(token) is None
    assert bearer_from_header(f"Bearer {token} extra") is None
