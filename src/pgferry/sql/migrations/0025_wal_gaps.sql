-- pgferry 0025: a WAL capture slot that is lost is a recorded gap of every
-- consumer that reads what it captured. When PostgreSQL invalidated the slot
-- (max_slot_wal_keep_size) or someone dropped it, the changes committed
-- since ferry.wal_slot.lsn never reach the log; until now that was said
-- only in ferry.wal_slot.note, which the next reset overwrote, and no
-- consumer was told. Now ferry._record_wal_loss writes one row in
-- ferry.gaps (cause 'wal slot lost') for each consumer whose streams a WAL
-- capture writes to: when the relay finds the slot lost (open: to_lsn
-- NULL), closed by ferry.reset_wal_slot at the new slot's position. So
-- status, `pgferry retention show`, the metrics and the dashboard show it
-- where they show retention gaps, and it stays as history.
--
-- Such a gap differs from a retention one: the changes never entered the
-- log, so no event ids, no count (events NULL: unknown), and no cursor was
-- moved: the consumer is not stalled and reads on (next_batch and maintain
-- leave these gaps out of their stall checks). Its bounds:
--   from_lsn, to_lsn     the WAL range whose changes are missing (the log
--                        was complete up to from_lsn; to_lsn NULL: open);
--   from_tick, to_tick   the log's ticks around the hole (the newest tick
--                        when capture last appended; the newest at the
--                        reset, or at detection while open);
--   oldest_event_at      the commit time of the last change captured (the
--                        missing ones were committed after it);
--   newest_event_at      the reset (NULL while open).

alter table ferry.gaps
    add column from_lsn pg_lsn,
    add column to_lsn   pg_lsn,
    alter column events drop not null;

comment on column ferry.gaps.from_lsn is
    'cause ''wal slot lost'': the changes committed after this WAL position are not in the log.';
comment on column ferry.gaps.to_lsn is
    'cause ''wal slot lost'': ... up to this one, where ferry.reset_wal_slot started the new slot (NULL: not reset yet).';
comment on column ferry.gaps.events is
    'Events the consumer never got; NULL for a WAL loss (the changes never reached the log: how many is unknown).';

-- retention_status() returns one more column (wal_gaps): its file defines the new one.
drop function if exists ferry.retention_status();
