-- net._request_is_queued(request_id bigint) returns boolean
--
-- Whether the request is queued or waiting for a retry (not finished).
-- SECURITY DEFINER: a writer may ask about its own request ids without
-- reading the queue; it answers yes or no only.
--
-- Calls:   -
-- Reads:   net.http_request_queue
-- Writes:  -
-- Raises:  -
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: PUBLIC (the default)

create or replace function net._request_is_queued(request_id bigint) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
    select exists (select 1 from net.http_request_queue q where q.id = request_id)
$$;
