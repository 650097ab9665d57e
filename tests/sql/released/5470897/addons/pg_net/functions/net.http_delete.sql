-- net.http_delete( url text, params jsonb default '{}'::jsonb, headers jsonb default '{}'::jsonb, timeout_milliseconds integer default 5000, body jsonb default null) returns bigint
--
-- pg_net's API: queues a DELETE (with an optional JSON body), sent after the
-- calling transaction commits. Returns the request id.
--
-- Calls:   net._enqueue
-- Reads:   -
-- Writes:  -
-- Raises:  22004, 22023, 23502
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.http_delete(
    url text,
    params jsonb default '{}'::jsonb,
    headers jsonb default '{}'::jsonb,
    timeout_milliseconds integer default 5000,
    body jsonb default null)
returns bigint language sql volatile parallel unsafe as $$
    select net._enqueue('DELETE', url, params, headers, body, timeout_milliseconds)
$$;
