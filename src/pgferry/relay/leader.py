"""Leader election for singleton jobs (the ticker and retention).

The leader is whoever holds a session advisory lock. PostgreSQL releases it
the moment the holder's connection ends, so a SIGKILLed leader is replaced
by a standby within one retry interval. The job runs on the very connection
that holds the lock: if that connection is lost, so is the job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import asyncpg

from pgferry import db, sql
from pgferry.aio import backoff_delay, wait_for_event
from pgferry.db import CONNECTION_ERRORS
from pgferry.errors import DatabaseUnreachable
from pgferry.schema import LOCK_CLASS

log = logging.getLogger(__name__)

TICKER_LOCK = 2
WAL_CAPTURE_LOCK = 5


async def lead(
    url: str,
    lock_id: int,
    job: Callable[[asyncpg.Connection, asyncio.Event], Awaitable[None]],
    stop: asyncio.Event,
    *,
    name: str,
    retry_interval: float = 1.0,
    on_change: Callable[[bool], None] | None = None,
    liveness: db.Liveness | None = None,
) -> None:
    """Run ``job`` whenever this process holds leadership, until ``stop`` is set.

    The connection holds the leadership lock, so it gets ``liveness`` deadlines:
    a leader whose connection goes silent gives up within ``command_timeout``,
    and PostgreSQL frees the lock within ``session_timeout``.
    """
    connect_kwargs = (liveness or db.Liveness()).connect_kwargs(f"pgferry {name}", holds_locks=True)
    failures = 0
    while not stop.is_set():
        try:
            conn = await db.connect(url, **connect_kwargs)
        except DatabaseUnreachable as exc:
            failures += 1
            delay = backoff_delay(failures, base=0.2, cap=db.RECONNECT_BACKOFF_CAP)
            log.warning("%s: %s; retrying in %.1f s", name, exc, delay)
            await wait_for_event(stop, delay)
            continue
        leading = False
        try:
            failures = 0
            waiting_logged = False
            while not stop.is_set():
                if await conn.fetchval(sql.query("try_advisory_lock"), LOCK_CLASS, lock_id):
                    leading = True
                    log.info("%s: this relay is now the leader", name)
                    if on_change:
                        on_change(True)
                    await job(conn, stop)
                    break
                if not waiting_logged:
                    log.info("%s: another relay leads; standing by", name)
                    waiting_logged = True
                await wait_for_event(stop, retry_interval)
        except CONNECTION_ERRORS as exc:
            log.warning("%s: lost the database connection (%s); reconnecting", name, db.describe(exc))
            await wait_for_event(stop, retry_interval * random.uniform(0.5, 1.0))
        except Exception:
            # e.g. a statement_timeout or deadlock in housekeeping: step down, let
            # another relay (or this one, later) lead, rather than crash.
            failures += 1
            log.exception("%s: unexpected error; stepping down for a while", name)
            await wait_for_event(stop, backoff_delay(failures, base=1.0, cap=30.0))
        finally:
            if leading:
                log.info("%s: stepped down", name)
                if on_change:
                    on_change(False)
            if not conn.is_closed():
                try:
                    await asyncio.wait_for(conn.close(), 5)
                except Exception:  # noqa: BLE001 - closing a broken connection may fail any way it likes
                    conn.terminate()
