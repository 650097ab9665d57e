"""Reading one HTTP/1.x response from the bytes of a connection, without I/O.

Why not a parser library: httptools (llhttp) parsed responses here before,
and three things it cannot do decided against it. It cannot say where a
response ended inside the bytes it was fed, so a second answer (or a stray
one) on a kept-alive connection could be read as the answer to the NEXT
request, which is how a rejected event once got recorded as delivered. It
cannot finish a body delimited by the connection closing (HTTP/1.0 servers,
``Connection: close`` without a length). And it refuses what curl accepts,
such as header names with spaces, which the pg_net API must record as pg_net
does. So this module frames responses itself, byte-exact, and is held to a
stricter bar than the library it replaces: tests/delivery/test_http1.py
checks it against h11 and llhttp on generated responses split at every
boundary, and tests/delivery/conformance against real servers.

The rules, in the order RFC 9112 gives them (section 6.3), with curl's
leniency where it cannot cause a wrong attribution and strictness where it
could:
- interim answers (1xx but 101) are skipped; an unasked-for 101 is an error;
- 204 and 304 have no body;
- ``Transfer-Encoding`` ending in ``chunked`` frames the body in chunks; any
  other transfer coding means "until the connection closes";
- else ``Content-Length`` (several must agree) frames it;
- else the body runs until the connection closes.
Anything that makes the framing doubtful (both a length and chunked, a bad
length, a malformed chunk) is a ``ProtocolError``: the caller must close the
connection. Header lines are lenient (any name without a colon in it,
folded lines, bare LF line ends), except that a framing header whose name
is padded with whitespace is refused rather than guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: The most a response's status line and headers (and a chunked body's trailers) may take.
MAX_HEAD_BYTES = 128 * 1024
#: The longest chunk-size line (size plus extensions) accepted.
MAX_CHUNK_LINE = 4096
#: The most an unfinished header block may hold and still become one of MAX_HEAD_BYTES: its
#: last line and the CR of the blank line after it, still waiting for the LF.
_MAX_INCOMPLETE = MAX_HEAD_BYTES + 1

#: Heads up to this size are remembered, parsed (status, framing, a few headers), in up to
#: MAX_CACHED_HEADS entries: an endpoint answers with the same bytes again and again (a Date
#: header changes once a second), and parsing a head in Python costs ~1.5 us, a lookup ~0.1.
MAX_CACHED_HEAD = 1024
MAX_CACHED_HEADS = 512
_HEADS: dict[bytes, tuple[int, str, int, bool, str | None, str | None, str | None, int | None, int, int]] = {}

_FRAMING = frozenset((b"content-length", b"transfer-encoding"))
#: The headers the reader looks at (lowercased).
_KNOWN = frozenset((*_FRAMING, b"connection", b"keep-alive", b"retry-after", b"location", b"content-type"))
_IDLE_TIMEOUT = re.compile(rb"(?:^|[\s,;])timeout\s*=\s*(\d{1,6})")


#: libcurl's words (curl_easy_strerror) for what ends a response early; the pg_net API records
#: them as pg_net does (checked with curl 7.88 against the same answers).
WEIRD = "Weird server reply"  # a malformed header line or length
NOT_HTTP = "Unsupported protocol"  # no HTTP/1.x status line: libcurl reads it as HTTP/0.9, refused
RECV_ERROR = "Failure when receiving data from the peer"  # a malformed chunk, headers too long, a reset
NOTHING = "Server returned nothing (no headers, no data)"  # closed before a status line
PARTIAL = "Transferred a partial file"  # closed after the status line, before the promised end


class ProtocolError(Exception):
    """What came back is not an HTTP/1.x response we can frame: close the connection.
    ``curl``: what libcurl calls this failure."""

    def __init__(self, message: str, curl: str = WEIRD) -> None:
        super().__init__(message)
        self.curl = curl


class Truncated(Exception):
    """The connection closed before the response was complete. ``got_bytes``: any byte of it
    came; ``got_status``: its status line did (libcurl tells the two apart: NOTHING, PARTIAL)."""

    def __init__(self, got_bytes: bool, got_status: bool = False) -> None:
        super().__init__("the connection closed before a complete response")
        self.got_bytes = got_bytes
        self.got_status = got_status


@dataclass(slots=True)
class Response:
    status: int = 0
    reason: str = ""
    #: minor version: 0 for HTTP/1.0, 1 for HTTP/1.1
    minor: int = 1
    #: every header as sent (name spelling kept), when the reader was asked to keep them
    headers: list[tuple[str, str]] = field(default_factory=list)
    retry_after: str | None = None
    location: str | None = None
    content_type: str | None = None
    #: the start of the body, up to the reader's ``keep_body`` bytes (decoded, not chunk-framed)
    body: bytearray = field(default_factory=bytearray)
    body_bytes: int = 0
    #: whether the connection may carry another request after this response
    keep_alive: bool = False
    #: seconds the server keeps the connection open while idle (``Keep-Alive: timeout=N``), if it said
    idle_timeout: int | None = None


# reader states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ResponseReader:
    """Reads the response to one request.

    ``feed`` returns the final response once its last byte has arrived and
    None until then; ``feed_eof`` is called when the connection closes.
    After the response, ``extra`` tells whether more bytes came than the
    response held: such a connection must not carry another request.
    """

    __slots__ = ("_buf", "_chunk_left", "_got", "_keep_body", "_keep_headers", "_left", "_scan", "_state", "extra",
                 "response")  # fmt: skip

    def __init__(self, keep_body: int = 2048, keep_headers: bool = False) -> None:
        self._keep_body = keep_body
        self._keep_headers = keep_headers
        self._buf = bytearray()
        self._state = _HEAD
        self._left = 0  # body bytes still expected (Content-Length)
        self._chunk_left = 0
        self._scan = 0  # how far the buffer was searched for the end of a header block
        self._got = False
        self.extra = False
        self.response = Response()

    def again(self) -> ResponseReader:
        """A new reader with the same settings (the same request, sent once more)."""
        return ResponseReader(self._keep_body, self._keep_headers)

    def feed(self, data: bytes) -> Response | None:
        if not data:
            return None
        self._got = True
        state = self._state
        if state == _LENGTH and not self._buf:  # the rest of a body of known length
            return self._length(data)
        if state == _DONE:
            self.extra = True
            return None
        if state == _HEAD and not self._buf:
            rest = self._whole_head(data)
            if rest is not None:
                if self._state == _LENGTH and rest:
                    return self._length(rest)
                if self._state == _DONE and not rest:
                    return self.response
                data = rest
        self._buf += data
        return self._run()

    def _whole_head(self, data: bytes) -> bytes | None:
        """The common case, read without buffering: a whole head in one read, CRLF line ends, no
        blank lines before it. Returns the bytes after the head, or None (not that case)."""
        end = data.find(b"\r\n\r\n")
        if not 0 < end <= MAX_HEAD_BYTES - 2 or data[:5] != b"HTTP/":  # the block counts its last CRLF
            return None
        head = data[:end]
        if head.count(b"\n") != head.count(b"\r\n"):  # a bare LF could have ended it earlier
            return None
        known = None if self._keep_headers else _HEADS.get(head)
        if known is None:
            self._parse_head(head.split(b"\r\n"))
            if end <= MAX_CACHED_HEAD and not self._keep_headers and self._state != _HEAD:
                self._remember(head)
        else:
            r = self.response
            (r.status, r.reason, r.minor, r.keep_alive, r.retry_after, r.location, r.content_type, r.idle_timeout,
             self._state, self._left) = known  # fmt: skip
        return data[end + 4 :]

    def feed_eof(self) -> Response:
        """The connection closed: the response if that ends it, else Truncated."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            return self.response
        if self._state == _DONE:
            return self.response
        # In the head, the status line is whole once a line end follows it (an interim answer
        # read before does not count: libcurl says NOTHING after a lone 100 Continue too).
        status = self._state != _HEAD or b"\n" in self._buf.lstrip(b"\r\n")
        raise Truncated(self._got, status)

    # -- states --------------------------------------------------------------

    def _run(self) -> Response | None:
        steps = _STEPS  # built once: making seven bound methods per call cost ~0.2 us a response
        while self._state != _DONE:
            if not steps[self._state](self):
                return None
        if self._buf:
            self.extra = True
            self._buf.clear()
        return self.response

    def _buffered_length(self) -> bool:
        data = bytes(self._buf)
        self._buf.clear()
        return self._length(data) is not None

    def _buffered_until_close(self) -> bool:
        self._keep(self._buf)
        self._buf.clear()
        return False

    def _head(self) -> bool:
        buf = self._buf
        # Blank lines before the status line are skipped (what llhttp and curl do).
        start = 0
        while start < len(buf) and buf[start] in b"\r\n":
            start += 1
        if start:
            del buf[:start]
            self._scan = 0
        end, blank = self._block_end()
        if end < 0 or end > MAX_HEAD_BYTES:
            if end > MAX_HEAD_BYTES or len(buf) > _MAX_INCOMPLETE:
                raise ProtocolError(f"invalid HTTP response: headers longer than {MAX_HEAD_BYTES} bytes", RECV_ERROR)
            return False
        head = bytes(buf[:end])
        del buf[: end + blank]
        self._parse_head([line[:-1] if line[-1:] == b"\r" else line for line in head.split(b"\n")])
        return True

    def _remember(self, head: bytes) -> None:
        """Keep what ``head`` said (the same few heads come back from an endpoint again and again)."""
        if len(_HEADS) >= MAX_CACHED_HEADS:
            _HEADS.clear()
        r = self.response
        _HEADS[head] = (r.status, r.reason, r.minor, r.keep_alive, r.retry_after, r.location, r.content_type,
                        r.idle_timeout, self._state, self._left)  # fmt: skip

    def _parse_head(self, lines: list[bytes]) -> None:
        """The status line and header lines of one head, line ends removed."""
        minor, status, reason = _status_line(lines[0])
        if status == 101:
            raise ProtocolError("unexpected 101 Switching Protocols (no upgrade was asked for)")
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints, ...): the real one follows
            return
        response = self.response
        response.status, response.reason, response.minor = status, reason, minor
        lengths: list[bytes] = []
        codings: list[bytes] = []
        connection = b""
        transfer_encoded = False
        kept: list[tuple[bytes, bytes]] | None = [] if self._keep_headers else None
        folded = False
        for line in lines[1:]:
            if not line:
                continue
            if line[0] in (32, 9):  # obs-fold: continues the previous header's value
                folded = True
                break
            name, colon, value = line.partition(b":")
            if not colon:
                continue  # not a header line; curl ignores these too
            key = name.lower()
            if key not in _KNOWN:
                stripped = key.strip()
                if stripped in _KNOWN:
                    if stripped in _FRAMING:
                        raise ProtocolError(f"invalid HTTP response: whitespace in header name {name!r}")
                    key = stripped
                elif kept is not None:
                    if stripped:
                        kept.append((name, value.strip()))
                    continue
                else:
                    continue
            value = value.strip()
            if kept is not None:
                kept.append((name, value))
            if key == b"content-length":
                lengths.append(value)
            elif key == b"transfer-encoding":
                transfer_encoded = True
                codings.extend(c.strip().lower() for c in value.split(b",") if c.strip())
            elif key == b"connection":
                connection += b"," + value.lower()
            elif key == b"retry-after":
                response.retry_after = _text(value)
            elif key == b"location":
                response.location = _text(value)
            elif key == b"keep-alive":
                found = _IDLE_TIMEOUT.search(value)
                response.idle_timeout = int(found.group(1)) if found else None
            else:  # content-type
                response.content_type = _text(value)
        if folded:  # rare: folded lines are unfolded first, and everything read again
            self._parse_folded(lines)
            return
        if kept is not None:
            response.headers = [(_text(n.strip()), _text(v)) for n, v in kept]
        if connection:
            tokens = {t.strip() for t in connection.split(b",")}
            response.keep_alive = b"close" not in tokens and (minor == 1 or b"keep-alive" in tokens)
        else:
            response.keep_alive = minor == 1
        if minor == 0 and transfer_encoded:  # HTTP/1.0 with Transfer-Encoding: its framing may be faulty (RFC 9112 6.1)
            response.keep_alive = False
        self._frame(status, lengths, codings)

    def _parse_folded(self, lines: list[bytes]) -> None:
        """``_parse_head`` for a head with obs-fold lines: each joins the previous line."""
        unfolded = [lines[0]]
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):
                if len(unfolded) == 1:
                    raise ProtocolError("invalid HTTP response: continuation line before any header")
                if unfolded[-1].partition(b":")[0].strip().lower() in _FRAMING:
                    raise ProtocolError("invalid HTTP response: folded framing header")
                unfolded[-1] = unfolded[-1].rstrip() + b" " + line.strip()
            else:
                unfolded.append(line)
        self._parse_head(unfolded)

    def _frame(self, status: int, lengths: list[bytes], codings: list[bytes]) -> None:
        if status in (204, 304):
            self._state = _DONE
            return
        if codings:
            if lengths:
                raise ProtocolError("invalid HTTP response: both Content-Length and Transfer-Encoding")
            if codings[-1] == b"chunked":
                if codings.count(b"chunked") > 1:
                    raise ProtocolError("invalid HTTP response: chunked applied twice")
                self._state = _CHUNK_SIZE
            else:
                self._until_close()
            return
        if len(lengths) == 1 and lengths[0].isdigit() and len(lengths[0]) <= 18:  # the common case
            self._left = int(lengths[0])
            self._state = _LENGTH if self._left else _DONE
            return
        if lengths:
            values = {v.strip() for joined in lengths for v in joined.split(b",")}
            if len(values) != 1:
                raise ProtocolError("invalid HTTP response: conflicting Content-Length values")
            value = values.pop()
            if not value.isdigit() or len(value) > 18:
                raise ProtocolError(f"invalid HTTP response: bad Content-Length {value[:40]!r}")
            self._left = int(value)
            self._state = _LENGTH if self._left else _DONE
            return
        self._until_close()

    def _until_close(self) -> None:
        self.response.keep_alive = False
        self._state = _UNTIL_CLOSE

    def _length(self, data: bytes) -> Response | None:
        take = self._left
        if len(data) < take:
            self._left -= len(data)
            self._keep(data)
            return None
        self._keep(data[:take] if len(data) > take else data)
        self._left = 0
        self._state = _DONE
        if len(data) > take:
            self.extra = True
        return self.response

    def _chunk_size(self) -> bool:
        buf = self._buf
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > MAX_CHUNK_LINE:
                raise ProtocolError("invalid HTTP response: chunk size line too long", RECV_ERROR)
            return False
        if end > MAX_CHUNK_LINE:
            raise ProtocolError("invalid HTTP response: chunk size line too long", RECV_ERROR)
        line = bytes(buf[:end]).rstrip(b"\r")
        del buf[: end + 1]
        size = line.split(b";", 1)[0].strip(b" \t")
        if not size or len(size) > 15 or any(c not in b"0123456789abcdefABCDEF" for c in size):
            raise ProtocolError(f"invalid HTTP response: bad chunk size {line[:40]!r}", RECV_ERROR)
        self._chunk_left = int(size, 16)
        self._state = _CHUNK_DATA if self._chunk_left else _TRAILERS
        return True

    def _chunk_data(self) -> bool:
        buf = self._buf
        if not buf:
            return False
        take = min(self._chunk_left, len(buf))
        self._keep(buf[:take])
        del buf[:take]
        self._chunk_left -= take
        if self._chunk_left:
            return False
        self._state = _CHUNK_END
        return True

    def _chunk_end(self) -> bool:
        buf = self._buf
        if buf[:2] == b"\r\n":
            del buf[:2]
        elif buf[:1] == b"\n":
            del buf[:1]
        elif buf == b"\r" or not buf:
            return False
        else:
            raise ProtocolError("invalid HTTP response: chunk data not followed by a line end", RECV_ERROR)
        self._state = _CHUNK_SIZE
        return True

    def _trailers(self) -> bool:
        buf = self._buf
        if buf[:2] == b"\r\n" or buf[:1] == b"\n":  # no trailers
            del buf[: 2 if buf[:1] == b"\r" else 1]
            self._state = _DONE
            return True
        end, blank = self._block_end()
        if end < 0 or end > MAX_HEAD_BYTES:
            if end > MAX_HEAD_BYTES or len(buf) > _MAX_INCOMPLETE:
                raise ProtocolError(f"invalid HTTP response: trailers longer than {MAX_HEAD_BYTES} bytes", RECV_ERROR)
            return False
        del buf[: end + blank]  # trailer fields are read past, not kept
        self._state = _DONE
        return True

    def _block_end(self) -> tuple[int, int]:
        """Where the header block at the start of the buffer ends (before its blank line), and
        the blank line's length; (-1, 0) while incomplete. Lines may end in CRLF or a bare LF,
        as curl accepts. Searching resumes where the last search stopped, so a head that
        arrives a byte at a time costs linear time."""
        buf = self._buf
        start = max(0, self._scan - 2)
        crlf = buf.find(b"\n\r\n", start)
        lf = buf.find(b"\n\n", start)
        if crlf < 0 and lf < 0:
            self._scan = len(buf)
            return -1, 0
        self._scan = 0
        if lf < 0 or (0 <= crlf < lf):
            return crlf + 1, 2
        return lf + 1, 1

    def _keep(self, data: bytes | bytearray) -> None:
        response = self.response
        response.body_bytes += len(data)
        room = self._keep_body - len(response.body)
        if room > 0:
            response.body += data[:room]


#: ``ResponseReader``'s step for each state below _DONE, indexed by state.
_STEPS = (ResponseReader._head, ResponseReader._buffered_length, ResponseReader._chunk_size,
          ResponseReader._chunk_data, ResponseReader._chunk_end, ResponseReader._trailers,
          ResponseReader._buffered_until_close)  # fmt: skip
assert len(_STEPS) == _DONE


def _text(value: bytes) -> str:
    """A header value or reason phrase as text, a NUL replaced by a space (RFC 9110 5.5 allows it):
    PostgreSQL text cannot hold NUL, and an attempt whose error quoted one could not be recorded
    (the worker failed and sent again, forever)."""
    text = value.decode("latin-1")
    return text.replace("\0", " ") if "\0" in text else text


def _status_line(line: bytes) -> tuple[int, int, str]:
    """(minor version, status, reason) of ``HTTP/1.x NNN reason``."""
    version = line[:8]
    if version == b"HTTP/1.1" or version == b"HTTP/1.0":  # noqa: PLR1714 - two compares beat a tuple
        code = line[9:12]
        if line[8:9] == b" " and line[12:13] in (b" ", b"") and code.isdigit() and code[0] != 0x30:
            return version[7] - 0x30, int(code), _text(line[13:].strip())
        # lenient: several spaces before the code
        code, _, reason = line[8:].lstrip(b" ").partition(b" ")
        if len(code) == 3 and code.isdigit() and code[0] != 0x30 and line[8:9] == b" ":
            return version[7] - 0x30, int(code), _text(reason.strip())
    raise ProtocolError(f"invalid HTTP response: status line {line[:60]!r}", NOT_HTTP)
