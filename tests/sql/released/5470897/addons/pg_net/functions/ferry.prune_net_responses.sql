-- ferry.prune_net_responses(max_rows integer default 10000) returns integer
--
-- Deletes up to max_rows net._http_response rows older than
-- ferry.config.net_response_ttl (pg_net's pg_net.ttl). Called by
-- ferry.housekeeping when the pg_net add-on is installed. Returns how many.
--
-- Calls:   -
-- Reads:   ferry.config
-- Writes:  net._http_response
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.prune_net_responses(max_rows integer default 10000) returns integer
language plpgsql as $$
declare
    n integer;
begin
    delete from net._http_response where ctid in (
        select ctid from net._http_response
        where created < now() - (select net_response_ttl from ferry.config)
        order by created limit max_rows);
    get diagnostics n = row_count;
    return n;
end $$;
