"""A Server-Sent Events reader for the tests, after the HTML standard's parsing rules
(lines end in CRLF, LF or CR; ``field: value`` with one optional space after the colon;
lines starting with ``:`` are comments; a blank line dispatches the event)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp


@dataclass
class SseEvent:
    event: str
    data: str
    id: str | None
    #: comments seen since the previous event (heartbeats)
    comments: int = 0


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[SseEvent]:
    event, last_id, comments = "message", None, 0
    data: list[str] = []
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while True:
            cut = min((i for i in (buffer.find(b"\r"), buffer.find(b"\n")) if i >= 0), default=-1)
            if cut < 0 or (buffer[cut : cut + 1] == b"\r" and cut + 1 == len(buffer)):
                break  # no whole line yet (a CR may be the first half of a CRLF)
            line = buffer[:cut].decode()
            buffer = buffer[cut + (2 if buffer[cut : cut + 2] == b"\r\n" else 1) :]
            if not line:
                if data:
                    yield SseEvent(event, "\n".join(data), last_id, comments)
                    comments = 0
                event, data = "message", []
                continue
            if line.startswith(":"):
                comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id" and "\0" not in value:
                last_id = value
