-- net.wake() returns void
--
-- pg_net's API: a no-op here; relays are woken by ticks.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.wake() returns void language sql as $$ select $$;
