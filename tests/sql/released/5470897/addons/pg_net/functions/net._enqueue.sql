-- net._enqueue(method text, url text, params jsonb, headers jsonb, body jsonb, timeout_milliseconds integer) returns bigint
--
-- Queues one request for net.http_get/post/delete: an event of stream
-- 'net.http' (what the relay delivers) and its row in net.http_request_queue
-- (what cancels it); it is sent after the calling transaction commits.
-- Returns the request id (the event's id). Raises 22023 for a bad URL or a
-- timeout out of 1..600000 ms, 23502 for a NULL url or timeout (pg_net's
-- wording).
--
-- Calls:   ferry._check_headers_map, ferry.publish, net._encode_url_with_params_array, net._queue_request, net._urlencode_string
-- Reads:   -
-- Writes:  -
-- Raises:  22004, 22023, 23502
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net._enqueue(method text, url text, params jsonb, headers jsonb, body jsonb,
                                        timeout_milliseconds integer) returns bigint
language plpgsql as $$
declare
    v_url text;
    v_method text;
    v_body text;
    v_id bigint;
begin
    v_url := net._encode_url_with_params_array(
        url,
        coalesce((select array_agg(net._urlencode_string(k) || '=' || net._urlencode_string(v))
                  from jsonb_each_text(params) as p(k, v)), '{}'));
    if v_url is null then
        raise exception 'null value in column "url" of relation "http_request_queue" violates not-null constraint'
            using errcode = '23502';
    end if;
    if timeout_milliseconds is null then
        raise exception 'null value in column "timeout_milliseconds" of relation "http_request_queue" violates not-null constraint'
            using errcode = '23502';
    end if;
    if timeout_milliseconds not between 1 and 600000 then
        raise exception 'timeout_milliseconds must be between 1 and 600000, got %', timeout_milliseconds
            using errcode = '22023';
    end if;
    if headers is not null then
        perform ferry._check_headers_map(headers);
    end if;
    v_method := upper(method::net.http_method);
    v_body := case when body is null then null else body::text end;
    v_id := ferry.publish('net.http', jsonb_build_object(
        'method', v_method, 'url', v_url, 'headers', headers, 'body', v_body,
        'timeout_ms', timeout_milliseconds));
    perform net._queue_request(v_id, v_method, v_url, headers, v_body, timeout_milliseconds);
    return v_id;
end $$;
