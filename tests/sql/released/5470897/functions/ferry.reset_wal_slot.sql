-- ferry.reset_wal_slot() returns pg_lsn
--
-- The operator's way out after WAL capture's slot was invalidated
-- (max_slot_wal_keep_size) or dropped: the changes between the last position
-- in the log and now are lost. Drops what is left of the slot, creates a
-- new one, notes the hole in ferry.wal_slot.note and returns the new
-- position. Run it on its own (a slot cannot be created after the
-- transaction wrote), then backfill the WAL-captured tables.
--
-- Calls:   ferry._ensure_wal_slot
-- Reads:   -
-- Writes:  ferry.wal_slot, the replication slot
-- Raises:  what ferry._ensure_wal_slot raises
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.reset_wal_slot() returns pg_lsn
language sql as $$ select (ferry._ensure_wal_slot(reset => true)).lsn $$;
