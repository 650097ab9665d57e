"""The pgoutput decoder (capture/pgoutput.py): against this server's real output (every kind of
column value and old tuple: text, null, unchanged TOAST, whole and key-only old rows), against an
encoder written here from the protocol's documentation, and against random bytes."""

from __future__ import annotations

import contextlib
import struct

import asyncpg
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pgferry.capture.pgoutput import (
    PG_EPOCH_US,
    UNCHANGED,
    Begin,
    Change,
    Commit,
    DecodeError,
    Relation,
    Truncate,
    decode,
)

# -- an encoder, from "Logical Replication Message Formats" -------------------------------

Row = list[str | object | None]


def _tuple(values: Row) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            data = str(v).encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


def insert(rel: int, values: Row) -> bytes:
    return b"I" + struct.pack("!I", rel) + b"N" + _tuple(values)


def update(rel: int, new: Row, old: Row | None, key: bool) -> bytes:
    head = b"U" + struct.pack("!I", rel)
    if old is not None:
        head += (b"K" if key else b"O") + _tuple(old)
    return head + b"N" + _tuple(new)


def relation(oid: int, schema: str, name: str, columns: list[tuple[str, int, bool]]) -> bytes:
    out = b"R" + struct.pack("!I", oid) + schema.encode() + b"\0" + name.encode() + b"\0" + b"f"
    out += struct.pack("!h", len(columns))
    for col, type_oid, key in columns:
        out += bytes([1 if key else 0]) + col.encode() + b"\0" + struct.pack("!Ii", type_oid, -1)
    return out


values = st.lists(st.one_of(st.none(), st.just(UNCHANGED), st.text(max_size=40)), max_size=12)
names = st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=["Cs"]), min_size=1, max_size=20)


@given(st.integers(0, 2**32 - 1), values)
def test_inserts_round_trip(rel: int, row: Row) -> None:
    assert decode(insert(rel, row)) == Change("I", rel, new=row)


@given(st.integers(0, 2**32 - 1), values, st.one_of(st.none(), values), st.booleans())
def test_updates_round_trip(rel: int, new: Row, old: Row | None,
                            key: bool) -> None:  # fmt: skip
    expected = Change("U", rel, new=new, old=old, old_is_key=key and old is not None)
    assert decode(update(rel, new, old, key)) == expected


@given(st.integers(0, 2**32 - 1), names, names, st.lists(st.tuples(names, st.integers(0, 2**32 - 1), st.booleans()),
                                                          max_size=8))  # fmt: skip
def test_relations_round_trip(oid: int, schema: str, name: str, columns: list[tuple[str, int, bool]]) -> None:
    m = decode(relation(oid, schema, name, columns))
    assert isinstance(m, Relation)
    assert (m.oid, m.schema, m.name) == (oid, schema, name)
    assert [(c.name, c.type_oid, c.is_key) for c in m.columns] == columns


@given(st.lists(st.integers(0, 2**32 - 1), max_size=5), st.integers(0, 3))
def test_truncates_round_trip(rels: list[int], options: int) -> None:
    m = decode(b"T" + struct.pack("!Ib", len(rels), options) + b"".join(struct.pack("!I", r) for r in rels))
    assert m == Truncate(rels, bool(options & 1), bool(options & 2))


@settings(max_examples=500)
@given(st.binary(max_size=64))
@example(b"R\x00\x00\x00\x00\x80\x00")  # a Relation whose name is not UTF-8 (found by this test, 2026-12-04)
def test_random_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)


@given(st.integers(0, 2**32 - 1), values.filter(bool), st.data())
def test_a_message_cut_anywhere_is_a_decode_error(rel: int, row: Row, data: st.DataObject) -> None:
    whole = insert(rel, row)
    cut = data.draw(st.integers(1, len(whole) - 1))
    with pytest.raises(DecodeError):
        decode(whole[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        decode(whole + b"x")


def test_binary_column_values_are_refused_by_name() -> None:
    with pytest.raises(DecodeError, match="binary"):
        decode(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"b" + struct.pack("!i", 0))


# -- the real thing --------------------------------------------------------------------------


async def test_this_servers_output_decodes_to_what_sql_says(conn: asyncpg.Connection) -> None:
    await conn.execute("create table t (id int primary key, v text, j jsonb, n numeric)")
    await conn.execute("alter table t replica identity full")
    # k keeps REPLICA IDENTITY DEFAULT: old rows are key-only ('K'), and big, stored out of line
    # (md5 text does not compress below the TOAST threshold), is unchanged ('u') when not set.
    await conn.execute("create table k (id int primary key, v text, big text)")
    await conn.execute("create publication p for table t, k")
    slot = f"test_pgoutput_{await conn.fetchval('select oid from pg_database where datname = current_database()')}"
    await conn.execute("select pg_create_logical_replication_slot($1, 'pgoutput')", slot)
    try:
        async with conn.transaction():
            xid = await conn.fetchval("select txid_current()::bigint")
            await conn.execute(
                "insert into t values (1, E'caf\\u00e9\\ttab', '{\"a\": [1, null]}', 1.50), (2, null, null, 'NaN')"
            )
            await conn.execute("update t set v = 'x' where id = 1")
            await conn.execute("delete from t where id = 2")
        await conn.execute("truncate t")
        await conn.execute("insert into k select 1, 'a', string_agg(md5(g::text), '') from generate_series(1, 500) g")
        await conn.execute("update k set v = 'b'")
        await conn.execute("update k set id = 2")
        await conn.execute("delete from k")
        rows = await conn.fetch(
            "select lsn::text, data from pg_logical_slot_peek_binary_changes($1, null, null, "
            "'proto_version', '1', 'publication_names', 'p')",
            slot,
        )
        messages = [decode(r["data"]) for r in rows]
    finally:
        await conn.execute("select pg_drop_replication_slot($1)", slot)
    begin, rel, i1, i2, u, d, commit = messages[:7]
    assert isinstance(begin, Begin) and begin.xid == xid % 2**32
    assert isinstance(rel, Relation) and (rel.schema, rel.name) == ("public", "t")
    assert [(c.name, c.type_oid, c.is_key) for c in rel.columns] == [
        ("id", 23, True), ("v", 25, True), ("j", 3802, True), ("n", 1700, True),  # FULL: every column is key
    ]  # fmt: skip
    assert i1 == Change("I", rel.oid, new=["1", "café\ttab", '{"a": [1, null]}', "1.50"])
    assert i2 == Change("I", rel.oid, new=["2", None, None, "NaN"])
    assert u == Change("U", rel.oid, new=["1", "x", '{"a": [1, null]}', "1.50"],
                       old=["1", "café\ttab", '{"a": [1, null]}', "1.50"])  # fmt: skip
    assert d == Change("D", rel.oid, old=["2", None, None, "NaN"])
    assert isinstance(commit, Commit) and commit.commit_lsn == begin.final_lsn
    assert commit.commit_time_us == begin.commit_time_us > PG_EPOCH_US
    assert any(isinstance(m, Truncate) and m.relations == [rel.oid] for m in messages[7:])
    k = next(m for m in messages if isinstance(m, Relation) and m.name == "k")
    assert [(c.name, c.is_key) for c in k.columns] == [("id", True), ("v", False), ("big", False)]
    inserted, *changes = [m for m in messages if isinstance(m, Change) and m.relation == k.oid]
    assert inserted.op == "I" and inserted.new is not None and len(str(inserted.new[2])) == 16_000
    assert changes == [
        Change("U", k.oid, new=["1", "b", UNCHANGED]),  # no old row: the key did not change
        Change("U", k.oid, new=["2", "b", UNCHANGED], old=["1", None, None], old_is_key=True),
        Change("D", k.oid, old=["2", None, None], old_is_key=True),
    ]
