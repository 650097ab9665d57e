-- net.worker_restart() returns boolean
--
-- pg_net's API: a no-op returning true; restart a relay with your process
-- manager instead.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.worker_restart() returns boolean language sql as $$ select true $$;
