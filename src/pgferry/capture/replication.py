"""The logical replication stream of WAL capture's slot, read by a thread of its own.

asyncpg cannot speak the streaming replication protocol and psycopg 3 does not; psycopg2
does (``LogicalReplicationConnection``), on a blocking connection. So a thread owns that
connection: it reads the server's messages without blocking (``read_message``) and hands
them to the event loop in batches, and it sends the server the position the relay has
confirmed (``send_feedback``), never one the relay did not give it, as soon as it is given
(``confirm`` wakes the thread: the ticker waits for that position, ferry._tick_fenced).
Keepalives are answered by psycopg2 with the last position sent.

Each batch carries the server's ``wal_end`` as of reading it: everything committed before it
has been sent. The relay confirms up to it when it has appended everything it was sent and
no transaction is open: that is how an idle capture lets the slot advance.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import select
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions
import psycopg2.extras

#: messages a batch may hold (the thread hands over sooner when the server has no more)
BATCH = 2_000
#: ... and bytes of them, so that the queue (8 batches) holds at most ~64 MB: bounded by count
#: alone, 8 batches of 2,000 rows of 1 MB were 16 GB (the relay grew by 340 MB on a 400 MB
#: transaction of large rows; outside probe)
BATCH_BYTES = 8 << 20
#: How the server spells values as text in the changes it sends (pgoutput writes each column with
#: its type's output function, under the replication session's settings): ISO dates with numeric
#: offsets, whatever the database's DateStyle (under 'SQL, DMY' and TimeZone Asia/Kolkata a
#: timestamptz came as '... IST' and was read back as Israel time, 3.5 hours off: outside probe),
#: floats exact, bytea in hex, intervals PostgreSQL's way, and the names of regclass, regtype,
#: regproc and the other reg* types schema-qualified unless in pg_catalog (search_path pg_catalog):
#: printed under the database's search_path, 'r_target' named public.r_target, and the relay's
#: session, whose search_path is pg_catalog's (db.SERVICE_SETTINGS), could not read it back; every
#: WAL-captured table's capture stopped there (outside probe). These override the database's and
#: role's defaults; the URL's own ``options`` are replaced.
TEXT_SETTINGS = (
    "-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c bytea_output=hex -c search_path=pg_catalog"
)
#: The replication session's client_encoding, whatever PGCLIENTENCODING, the database or the role say:
#: pgoutput writes values converted to it, and the decoder reads UTF-8. Under PGCLIENTENCODING=WIN1252
#: the leader crash-looped on the first non-ASCII value ("not UTF-8"), under a database's LATIN1 the
#: UTF-8 text 'cafÃ©' reached the log as 'café' (outside probe). asyncpg's sessions (every other one
#: pgferry opens) send client_encoding UTF8 in their startup packet themselves.
CLIENT_ENCODING = "UTF8"
#: feedback at least this often, so the server never thinks the relay is gone
FEEDBACK_INTERVAL = 1.0


class ReplicationError(Exception):
    """The stream could not be started or broke: the relay retries."""


@dataclass(slots=True)
class Batch:
    messages: list[bytes]
    wal_end: int
    #: each message's position in the WAL (a change's is its record's: ferry._append_wal_v2 gives it
    #: to the capture that held the table there)
    starts: list[int] = field(default_factory=list)


class ReplicationStream:
    """``async for batch in stream`` until ``close()``; ``confirm(lsn)`` moves the slot."""

    def __init__(self, url: str, slot: str, publication: str, start_lsn: int) -> None:
        self.url = url
        self.slot = slot
        self.publication = publication
        self.start_lsn = start_lsn
        self._confirmed = start_lsn
        self._stop = threading.Event()
        # confirm() writes a byte here to wake the thread from its wait for the server
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._queue: asyncio.Queue[Batch | BaseException] = asyncio.Queue(maxsize=8)
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"pgferry wal stream {slot}", daemon=True)
        self._started = False

    def confirm(self, lsn: int) -> None:
        """Everything committed before ``lsn`` is in the log: the server may forget it."""
        if lsn > self._confirmed:
            self._confirmed = lsn
            with contextlib.suppress(BlockingIOError, OSError):  # a byte is pending already; closed
                os.write(self._wake_w, b"!")

    async def batches(self) -> AsyncIterator[Batch]:
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    async def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")
        if self._started:
            await asyncio.to_thread(self._thread.join, 10)
        if not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    # -- the thread ------------------------------------------------------------

    def _hand_over(self, item: Batch | BaseException) -> bool:
        """Queue ``item`` for the event loop, waiting while it is full (back pressure);
        False when the stream was closed meanwhile."""
        try:
            future = asyncio.run_coroutine_threadsafe(self._put(item), self._loop)
        except RuntimeError:  # the loop is gone
            return False
        # One put, waited for however long the loop takes. Not cancelled and put again on a
        # timeout: a put that had already happened, its result not yet passed back by a busy
        # loop, was put twice (2,000 changes appended twice under load).
        while True:
            try:
                future.result(timeout=0.5)
                return True
            except TimeoutError:
                if self._stop.is_set():  # closing: whether it was queued or not, nobody reads it
                    future.cancel()
                    return False
            except (RuntimeError, concurrent.futures.CancelledError):  # the loop is gone
                return False

    async def _put(self, item: Batch | BaseException) -> None:
        await self._queue.put(item)

    def _run(self) -> None:
        conn = None
        try:
            conn = psycopg2.connect(
                self.url,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                application_name="pgferry wal stream",
                options=TEXT_SETTINGS,
                client_encoding=CLIENT_ENCODING,
            )
            cur = conn.cursor()
            cur.start_replication(
                slot_name=self.slot,
                decode=False,
                start_lsn=self.start_lsn,
                options={"proto_version": "1", "publication_names": self.publication},
            )
            sent = -1
            last_feedback = 0.0
            reported_end = 0
            while not self._stop.is_set():
                messages: list[bytes] = []
                starts: list[int] = []
                size = 0
                while len(messages) < BATCH and size < BATCH_BYTES:
                    msg = cur.read_message()
                    if msg is None:
                        break
                    messages.append(msg.payload)
                    starts.append(msg.data_start)
                    size += len(msg.payload)
                if messages:
                    if not self._hand_over(Batch(messages, cur.wal_end, starts)):
                        return
                    reported_end = cur.wal_end
                elif cur.wal_end > reported_end:
                    # A keepalive: everything committed before wal_end was sent. The loop may
                    # confirm up to it once it has appended what came before.
                    if not self._hand_over(Batch([], cur.wal_end)):
                        return
                    reported_end = cur.wal_end
                now = time.monotonic()
                confirmed = self._confirmed
                periodic = now - last_feedback >= FEEDBACK_INTERVAL
                if confirmed != sent or periodic:
                    # reply: once a second, ask for a keepalive back, whose wal_end lets an idle
                    # capture advance. Not with every confirmation: the answer, confirmed in turn,
                    # asked for the next, a loop of keepalives while the server read a large
                    # transaction (their wal_end inside it). Between them the server sends one
                    # when it waits for WAL past the confirmed position: trigger-only writes at
                    # 1,000/s beside an idle WAL-captured table had their ticks 4.2 ms (p50)
                    # after commit with the ticker waiting for this position (measured).
                    cur.send_feedback(
                        write_lsn=confirmed, flush_lsn=confirmed, apply_lsn=confirmed,
                        reply=periodic and not messages, force=True,
                    )  # fmt: skip
                    sent, last_feedback = confirmed, now
                if not messages:
                    ready, _, _ = select.select([conn, self._wake_r], [], [], 0.05)
                    if self._wake_r in ready:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
        except psycopg2.Error as exc:
            text = str(exc).strip()
            if "replication role" in text or "REPLICATION attribute" in text:  # PostgreSQL 15; 16 and later
                role = psycopg2.extensions.parse_dsn(self.url).get("user") or "<the relay's role>"
                text = (f"the relay's role may not stream the WAL ({text}); give it the REPLICATION attribute: "
                        f"alter role {role} replication")  # fmt: skip
            elif "no message from the libpq" in text or isinstance(exc, psycopg2.OperationalError):
                text = f"the replication connection was lost ({text})"  # libpq's words for a cut stream
            self._hand_over(ReplicationError(f"slot {self.slot}: {text}"))
        except BaseException as exc:  # noqa: BLE001 - the loop must hear of any end of the thread
            self._hand_over(exc)
        finally:
            if conn is not None:
                conn.close()
