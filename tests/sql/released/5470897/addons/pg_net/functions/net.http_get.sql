-- net.http_get( url text, params jsonb default '{}'::jsonb, headers jsonb default '{}'::jsonb, timeout_milliseconds integer default 5000) returns bigint
--
-- pg_net's API: queues a GET request, sent after the calling transaction
-- commits; params are appended to the URL percent-encoded. Returns the
-- request id, to look up in net._http_response.
--
-- Calls:   net._enqueue
-- Reads:   -
-- Writes:  -
-- Raises:  22004, 22023, 23502
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.http_get(
    url text,
    params jsonb default '{}'::jsonb,
    headers jsonb default '{}'::jsonb,
    timeout_milliseconds integer default 5000)
returns bigint language sql volatile parallel unsafe as $$
    select net._enqueue('GET', url, params, headers, null, timeout_milliseconds)
$$;
