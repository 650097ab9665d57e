"""A decoder for PostgreSQL's logical replication protocol (``pgoutput``, protocol version 1).

Hand-written because no maintained Python library decodes it on its own (psycopg and
asyncpg ship none; the few packages that do are unmaintained or tied to psycopg2's
replication connection), and the format is small and documented ("Logical Replication
Message Formats" in PostgreSQL's manual). Held to the bar the guide sets for code we
write by hand: tests decode the real output of the PostgreSQL these tests run and
compare it with what SQL says of the same rows, and property tests feed it random rows
and random bytes (tests/capture/test_pgoutput.py).

Only what WAL capture needs: Begin, Commit, Relation, Insert, Update, Delete and
Truncate; Origin, Type and logical Message are read and skipped. Column values stay in
PostgreSQL's text form: the database converts them back with the columns' own input
functions (``ferry._append_wal_v2``), so records come out equal to ``to_jsonb`` of the row.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

#: A column whose value the WAL did not carry: an unchanged TOASTed value in an UPDATE.
UNCHANGED = object()

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_INT64 = struct.Struct("!q")
_BEGIN = struct.Struct("!qqI")  # final (commit) LSN, commit time, xid
_COMMIT = struct.Struct("!bqqq")  # flags, commit LSN, end LSN, commit time
_TRUNCATE = struct.Struct("!Ib")  # relation count, options

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
PG_EPOCH_US = 946_684_800_000_000


class DecodeError(ValueError):
    """Bytes that are not a pgoutput message this decoder understands."""


@dataclass(slots=True)
class Column:
    name: str
    type_oid: int
    is_key: bool


@dataclass(slots=True)
class Relation:
    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: list[Column]
    #: what a consumer of the decoder derives once per relation (capture/wal.py: names, typed columns)
    shape: tuple[list[str], list[int], list[int], list[int]] | None = None


@dataclass(slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int  # since the Unix epoch
    xid: int


@dataclass(slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


#: One row: a value per column, in the relation's column order: text, None (NULL) or UNCHANGED.
Tuple = list[str | object | None]


@dataclass(slots=True)
class Change:
    """An Insert ('I'), Update ('U') or Delete ('D') of one row."""

    op: str
    relation: int
    new: Tuple | None = None  # Insert, Update
    old: Tuple | None = None  # Update with a logged old row, Delete (key only or whole row)
    old_is_key: bool = False  # old holds only the replica identity's key columns


@dataclass(slots=True)
class Truncate:
    relations: list[int] = field(default_factory=list)
    cascade: bool = False
    restart_identity: bool = False


Message = Begin | Commit | Relation | Change | Truncate | None


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 1  # after the message type

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        end = self.pos + s.size
        if end > len(self.data):
            raise DecodeError(f"message cut off: needs {end} bytes, has {len(self.data)}")
        values = s.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise DecodeError("message cut off")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError("string without its terminating zero byte")
        try:
            text = self.data[self.pos : end].decode()
        except UnicodeDecodeError:
            raise DecodeError("a name is not UTF-8 (WAL capture needs a UTF8 database)") from None
        self.pos = end + 1
        return text

    def tuple(self) -> Tuple:
        values, self.pos = _tuple(self.data, self.pos)
        return values

    def done(self) -> None:
        if self.pos != len(self.data):
            raise DecodeError(f"{len(self.data) - self.pos} trailing byte(s)")


def _tuple(data: bytes, pos: int) -> tuple[Tuple, int]:
    """TupleData at ``pos``: the values and the position after them. The hot path of WAL
    capture (one call per row), so written flat: no method calls per column."""
    try:
        n = (data[pos] << 8) | data[pos + 1]
        pos += 2
        values: Tuple = []
        append = values.append
        size = len(data)
        for _ in range(n):
            kind = data[pos]
            if kind == 0x74:  # 't': text, Int32 length then the bytes
                length = (data[pos + 1] << 24) | (data[pos + 2] << 16) | (data[pos + 3] << 8) | data[pos + 4]
                pos += 5
                end = pos + length
                if length & 0x80000000 or end > size:
                    raise DecodeError("column value cut off")
                append(data[pos:end].decode())
                pos = end
            elif kind == 0x6E:  # 'n': null
                append(None)
                pos += 1
            elif kind == 0x75:  # 'u': unchanged TOASTed value
                append(UNCHANGED)
                pos += 1
            else:
                raise DecodeError(f"unknown column kind {chr(kind)!r} (binary mode is not used)")
    except IndexError:
        raise DecodeError("message cut off") from None
    except UnicodeDecodeError:
        raise DecodeError("a column value is not UTF-8 (WAL capture needs a UTF8 database)") from None
    return values, pos


def decode(data: bytes) -> Message:
    """One pgoutput message; None for the kinds WAL capture skips (Origin, Type, Message)."""
    if not data:
        raise DecodeError("empty message")
    r = _Reader(data)
    kind = data[0]
    if kind == 0x49:  # 'I'
        (rel,) = r.take(_UINT32)
        if r.byte() != 0x4E:
            raise DecodeError("Insert without its new row")
        change = Change("I", rel, new=r.tuple())
    elif kind == 0x55:  # 'U'
        (rel,) = r.take(_UINT32)
        change = Change("U", rel)
        part = r.byte()
        if part in (0x4B, 0x4F):  # 'K' key, 'O' old row
            change.old, change.old_is_key = r.tuple(), part == 0x4B
            part = r.byte()
        if part != 0x4E:
            raise DecodeError("Update without its new row")
        change.new = r.tuple()
    elif kind == 0x44:  # 'D'
        (rel,) = r.take(_UINT32)
        part = r.byte()
        if part not in (0x4B, 0x4F):
            raise DecodeError("Delete without its key or old row")
        change = Change("D", rel, old=r.tuple(), old_is_key=part == 0x4B)
    elif kind == 0x42:  # 'B'
        final_lsn, ts, xid = r.take(_BEGIN)
        r.done()
        return Begin(final_lsn, ts + PG_EPOCH_US, xid)
    elif kind == 0x43:  # 'C'
        _flags, commit_lsn, end_lsn, ts = r.take(_COMMIT)
        r.done()
        return Commit(commit_lsn, end_lsn, ts + PG_EPOCH_US)
    elif kind == 0x52:  # 'R'
        (oid,) = r.take(_UINT32)
        schema, name = r.string(), r.string()
        identity = chr(r.byte())
        (n,) = r.take(_INT16)
        columns = []
        for _ in range(n):
            flags = r.byte()
            col = r.string()
            type_oid, _typmod = r.take(_UINT32), r.take(_INT32)
            columns.append(Column(col, type_oid[0], bool(flags & 1)))
        r.done()
        return Relation(oid, schema, name, identity, columns)
    elif kind == 0x54:  # 'T'
        count, options = r.take(_TRUNCATE)
        rels = [r.take(_UINT32)[0] for _ in range(count)]
        r.done()
        return Truncate(rels, bool(options & 1), bool(options & 2))
    elif kind in (0x4F, 0x59, 0x4D):  # 'O' origin, 'Y' type, 'M' logical message
        return None
    else:
        raise DecodeError(f"unknown message type {chr(kind)!r}")
    r.done()
    return change
