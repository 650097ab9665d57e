-- net.check_worker_is_up() returns void
--
-- Worker controls: pgferry's relay plays pg_net's background worker.
--
-- Calls:   -
-- Reads:   ferry.relays
-- Writes:  -
-- Raises:  P0001
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: PUBLIC (the default)

create or replace function net.check_worker_is_up() returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
    if not exists (select 1 from ferry.relays where heartbeat_at > now() - interval '15 seconds') then
        raise exception 'the pg_net background worker is not up'
            using detail = 'no pgferry relay has reported in the last 15 seconds, so requests are queued but not sent',
                  hint = 'start one with `pgferry run --database-url URL`';
    end if;
end $$;
