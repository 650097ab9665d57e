-- net.http_post( url text, body jsonb default '{}'::jsonb, params jsonb default '{}'::jsonb, headers jsonb default '{"Content-Type": "application/json"}'::jsonb, timeout_milliseconds integer default 5000) returns bigint
--
-- pg_net's API: queues a POST of body (JSON), sent after the calling
-- transaction commits. Content-Type must be application/json (added when
-- missing), as in pg_net. Returns the request id.
--
-- Calls:   net._enqueue
-- Reads:   -
-- Writes:  -
-- Raises:  22004, 22023, 23502, P0001
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.http_post(
    url text,
    body jsonb default '{}'::jsonb,
    params jsonb default '{}'::jsonb,
    headers jsonb default '{"Content-Type": "application/json"}'::jsonb,
    timeout_milliseconds integer default 5000)
returns bigint language plpgsql volatile parallel unsafe as $$
declare
    v_type text;
begin
    select value into v_type from jsonb_each_text(headers) where lower(key) = 'content-type' limit 1;
    if v_type is null then
        headers := headers || '{"Content-Type": "application/json"}'::jsonb;
    elsif v_type <> 'application/json' then
        raise exception 'Content-Type header must be "application/json"';
    end if;
    return net._enqueue('POST', url, params, headers, body, timeout_milliseconds);
end $$;
