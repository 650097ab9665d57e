"""A promotion or a restore: ids receivers may already hold are never handed out again.

A standby promoted after a failover (or a backup restored to a point in time) goes on from
the event ids it had replayed, and the old primary may have handed out, and delivered, ids
beyond them: receivers that de-duplicate by id (webhook-id ``evt_<id>``, JetStream's
Nats-Msg-Id, the Redis sink's marks, stream offsets) would drop new events as duplicates of
lost ones. Both start a new WAL timeline; ``ferry.after_promotion()`` (migration 0039) notices
it, moves the id sequences on past anything the lost history can have used and renames the
install. The ticker calls it before its first tick and every few seconds, the ownership
connection whenever it connects; what it did is a warning in the log.
"""

from __future__ import annotations

import logging

import asyncpg

from pgferry import sql

log = logging.getLogger(__name__)


async def check_timeline(conn: asyncpg.Connection) -> bool:
    """Run ``ferry.after_promotion()`` on ``conn``; log what it did. Whether it moved the ids now."""
    row = await conn.fetchrow(sql.query("after_promotion"))
    if row is None:
        return False
    log.warning(
        "this database is on WAL timeline %d, not %d: it was promoted from a standby or restored from a backup. "
        "Events the old primary committed after the last one this server received are lost with it, and "
        "receivers may hold events (delivered, read from a stream) this database no longer has. So that no new "
        "event is taken for one of those, event ids now go on from %d (%d skipped; tick and batch ids too) and "
        "this install's name in the brokers' duplicate checks changed from %s to %s. Events written here since "
        "the promotion and before now may have re-used lost ids. See docs/operations.md, \"Failover and "
        "restore\" (WAL capture needs ferry.reset_wal_slot() and a backfill)",
        row["new_timeline"], row["old_timeline"], row["next_event_id"], row["step"],
        row["old_instance"], row["new_instance"],
    )  # fmt: skip
    return True
