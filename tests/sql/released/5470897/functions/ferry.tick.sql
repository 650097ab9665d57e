-- ferry.tick(force boolean default false) returns bigint
--
-- Takes a tick now (force: even if nothing new was written) and returns its
-- id, or NULL when nothing new needed one. The relay's ticker calls
-- ferry._tick; this is for scripts and tests.
--
-- Calls:   ferry._tick
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.tick(force boolean default false) returns bigint
language sql as $$ select tick_id from ferry._tick(force) $$;
