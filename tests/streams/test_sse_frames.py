"""The SSE frames the API writes, against a client that takes an ``id:`` as read (pure: no database)."""

from __future__ import annotations

from datetime import UTC, datetime

from pgferry.streams.api import _frame
from pgferry.streams.offsets import Offset
from pgferry.streams.reader import END_HEADER, JsonText, StreamEvent


def _eventsource_v2(received: bytes) -> tuple[list[str], str | None]:
    """What Node's eventsource@2 makes of the bytes of a connection cut after ``received``: the
    ids of the events it dispatched, and the Last-Event-ID it reconnects with. Unlike the HTML
    standard (which commits the id at dispatch), it takes the id when it parses the line; a line
    the cut left unfinished is dropped."""
    dispatched: list[str] = []
    last_id: str | None = None
    data: list[str] = []
    *lines, _unfinished = received.decode().split("\n")
    for line in lines:
        if not line:
            if data:
                dispatched.append(last_id or "")
            data = []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            last_id = value
        elif name == "data":
            data.append(value)
    return dispatched, last_id


def test_an_event_s_id_comes_last_so_a_connection_cut_anywhere_resumes_after_an_event_received() -> None:
    """eventsource@2 resumed after an event whose ``id:`` line it had read but whose ``data:`` line
    was cut (62 of 2,694 events lost with random cuts; outside probe)."""
    at = datetime(2026, 12, 1, tzinfo=UTC)
    events = [
        StreamEvent(Offset(7, 41), "chat", None, JsonText('{"text": "' + "x" * 300 + '"}'), None, at),
        StreamEvent(Offset(7, 42), "chat", "k", {"n": 2}, {"trace": "t"}, at),
        StreamEvent(Offset(9, 50), "chat", None, {}, {END_HEADER: "end"}, at),
    ]
    frames = [_frame(e) for e in events]
    # Cut after every byte: the id it resumes from is the last event it dispatched, except with
    # the cut between an id's line and the blank line after it (one byte: a window no order of
    # the fields closes; it was the whole data line).
    stream = b"retry: 2000\n\n" + b"".join(frames)
    skipped = []
    for cut in range(len(stream) + 1):
        dispatched, resume = _eventsource_v2(stream[:cut])
        if resume != (dispatched[-1] if dispatched else None):
            skipped.append((stream[:cut][-60:], resume))
    assert len(skipped) == len(frames), skipped
    assert all(tail.endswith(f"\nid: {resume}\n".encode()) for tail, resume in skipped), skipped
    assert _eventsource_v2(stream)[0] == [str(e.offset) for e in events]
    for event, frame in zip(events, frames, strict=True):
        *fields, blank, _ = frame.split(b"\n")
        assert blank == b"" and fields[-1] == f"id: {event.offset}".encode(), frame
        assert [f.split(b":")[0] for f in fields[:-1]] == ([b"event", b"data"] if event is events[-1] else [b"data"])
