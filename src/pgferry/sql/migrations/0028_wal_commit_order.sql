-- pgferry 0028: WAL-captured and trigger-captured events in one commit order.
--
-- Until now WAL capture appended a source transaction's changes under the
-- relay's own transaction id, so they joined the log at the tick after the
-- relay's append, not at the tick after their commit: a transaction that
-- wrote a trigger-captured and a WAL-captured table had its trigger events
-- in one batch and its WAL events in a later one, behind trigger events of
-- transactions that committed after it. Now the relay appends each change
-- under its source transaction's id (ferry._append_wal_v2), so it belongs to
-- the batch of that transaction's commit, and the ticker waits before it
-- records a tick until WAL capture has appended every transaction the tick's
-- snapshot sees committed (ferry._tick_fenced): it takes the snapshot and
-- the WAL insert position (a fence), and records the tick with that snapshot
-- once the slot is confirmed past the position, which the relay does only
-- after its append committed. Batches then hold every event committed
-- between their ticks, whichever way it was captured.
--
-- Waiting is bounded: at most config.wal_order_wait (0 turns the wait off),
-- after which ticks wait for nothing until WAL capture has caught up, and
-- not at all while nobody streams the slot, WAL capture is failing or the
-- slot is lost, so a lagging or stalled decoder never stalls delivery.
-- A change whose transaction a recorded tick already sees (the wait ran
-- out, a tick taken by hand with ferry.tick()) is appended under the relay's
-- own transaction id instead, as before: it comes in a later batch, never
-- in none. ferry._append_wal_v2 decides that under ferry._tick's lock, at
-- the end of each append round, so no tick can be recorded between the
-- decision and the commit.
--
-- ferry._append_wal stays for relays of the previous release (it appends
-- under the relay's transaction id, which is always safe) and goes in a
-- later one.

alter table ferry.config
    add column wal_order_wait interval not null default '250 ms' check (wal_order_wait >= interval '0');

comment on column ferry.config.wal_order_wait is
    'The longest the ticker waits for WAL capture to append what a tick''s snapshot sees committed, so that WAL- and '
    'trigger-captured events share one commit order (migration 0028); past it, ticks wait for nothing until WAL '
    'capture has caught up. 0: no wait.';
