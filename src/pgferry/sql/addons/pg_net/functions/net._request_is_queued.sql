-- net._request_is_queued(request_id bigint) returns boolean
--
-- net._request_is_queued(request_id): whether the request is not finished.
--   SECURITY DEFINER (a writer may ask about its own request ids, not read
--   the queue). Tables: reads net.http_request_queue.
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
