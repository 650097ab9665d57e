-- ferry.backfill_pause(backfill bigint) returns text
--
-- Pauses a running backfill: no chunk commits after this returns (it waits
-- for one in progress); ferry.backfill_resume continues it after its last
-- chunk.
-- Returns the state afterwards ('paused'; also when it was paused already).
--
-- Calls:   ferry._set_backfill_state
-- Reads:   ferry.backfills
-- Writes:  ferry.backfills
-- Raises:  42704, 55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.backfill_pause(backfill bigint)
returns text language sql as $$
    select ferry._set_backfill_state(backfill, 'paused', array['running'])
$$;
