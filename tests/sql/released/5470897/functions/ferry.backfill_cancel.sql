-- ferry.backfill_cancel(backfill bigint) returns text
--
-- Cancels a running or paused backfill: no chunk commits after this returns
-- (it waits for one in progress). The READ events already written stay in
-- the log and are delivered.
-- Returns the state afterwards ('cancelled'; also when it was cancelled already).
--
-- Calls:   ferry._set_backfill_state
-- Reads:   ferry.backfills
-- Writes:  ferry.backfills
-- Raises:  42704, 55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.backfill_cancel(backfill bigint)
returns text language sql as $$
    select ferry._set_backfill_state(backfill, 'cancelled', array['running', 'paused'])
$$;
