"""ferry._envelope_text (what the relay sends) is ferry._envelope(...)::text, character for character."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
cases = st.tuples(
    st.sampled_from([None, "I", "U", "D", "R", "T"]),
    json_values,
    st.none() | json_values,
    st.none() | text,
    st.none() | text,
)


def generated(n: int) -> list[tuple[Any, ...]]:
    """n cases drawn by hypothesis (checked in one query below: a round trip per case is too slow)."""
    drawn: list[tuple[Any, ...]] = []

    @settings(max_examples=n, database=None, deadline=None)
    @given(cases)
    def draw(case: tuple[Any, ...]) -> None:
        drawn.append(case)

    draw()
    return drawn


async def test_the_text_envelope_is_the_jsonb_envelope_printed(conn: asyncpg.Connection) -> None:
    drawn = generated(400)
    rows = await conn.fetch(
        """select u.i, ferry._envelope(u.op::"char", u.p::jsonb, u.o::jsonb, u.s, u.t)::text as expected,
                  ferry._envelope_text(u.op::"char", u.p::jsonb, u.o::jsonb, u.s, u.t) as got
           from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                with ordinality as u(op, p, o, s, t, i)""",
        [c[0] for c in drawn],
        [orjson.dumps(c[1]).decode() for c in drawn],
        [None if c[2] is None else orjson.dumps(c[2]).decode() for c in drawn],
        [c[3] for c in drawn],
        [c[4] for c in drawn],
    )
    differ = [(drawn[r["i"] - 1], r["expected"], r["got"]) for r in rows if r["expected"] != r["got"]]
    assert not differ, differ[:3]
    assert len(rows) == len(drawn)
