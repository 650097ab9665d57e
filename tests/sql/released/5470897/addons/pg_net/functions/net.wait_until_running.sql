-- net.wait_until_running() returns void
--
-- pg_net's API: waits until a pgferry relay (pg_net's "worker") has reported
-- in the last 15 seconds.
--
-- Calls:   -
-- Reads:   ferry.relays
-- Writes:  -
-- Raises:  -
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: PUBLIC (the default)

create or replace function net.wait_until_running() returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
    while not exists (select 1 from ferry.relays where heartbeat_at > now() - interval '15 seconds') loop
        perform pg_sleep(0.1);
    end loop;
end $$;
