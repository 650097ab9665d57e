-- ferry.backfill_resume(backfill bigint) returns text
--
-- Makes a paused or failed backfill running again, to go on after its last
-- chunk (a failed one after its cause was fixed); a runner must then drive
-- it (`pgferry backfill --resume ID`).
-- Returns the state afterwards ('running'; also when it was running already).
--
-- Calls:   ferry._set_backfill_state
-- Reads:   ferry.backfills
-- Writes:  ferry.backfills
-- Raises:  42704, 55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.backfill_resume(backfill bigint)
returns text language sql as $$
    select ferry._set_backfill_state(backfill, 'running', array['paused', 'failed'])
$$;
