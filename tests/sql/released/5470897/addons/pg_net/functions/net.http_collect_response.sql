-- net.http_collect_response(request_id bigint, async boolean default true) returns net.http_response_result
--
-- pg_net's deprecated name for net._http_collect_response: the same result,
-- after the same deprecation notice pg_net raises.
--
-- Calls:   net._http_collect_response
-- Reads:   -
-- Writes:  -
-- Raises:  55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net.http_collect_response(request_id bigint, async boolean default true)
returns net.http_response_result language plpgsql volatile as $$
begin
    raise notice 'The net.http_collect_response function is deprecated.';
    return net._http_collect_response(request_id, async);
end $$;
