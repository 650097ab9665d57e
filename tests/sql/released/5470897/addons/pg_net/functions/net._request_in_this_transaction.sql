-- net._request_in_this_transaction(request_id bigint) returns boolean
--
-- Whether request_id was made in the calling, still open transaction (it is
-- only sent after that commits). SECURITY DEFINER so that a writer can ask
-- without reading the log; answers yes or no only.
--
-- Calls:   -
-- Reads:   ferry.events
-- Writes:  -
-- Raises:  -
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: PUBLIC (the default)

create or replace function net._request_in_this_transaction(request_id bigint) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
    select exists (select 1 from ferry.events e where e.id = request_id and e.txid = pg_current_xact_id_if_assigned())
$$;
