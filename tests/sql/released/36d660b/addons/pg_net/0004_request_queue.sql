-- pgferry pg_net add-on 0004: net.http_request_queue is a table again, so
-- `delete from net.http_request_queue where ...` and `truncate
-- net.http_request_queue` cancel requests, as pg_net users do; and invalid
-- URLs fail with libcurl's own words, as pg_net's do.
--
-- Supersedes, from 0001_net.sql: the view net.http_request_queue,
-- net._enqueue and net._encode_url_with_params_array; from 0003_roles.sql:
-- net._request_is_queued (still SECURITY DEFINER).
--
-- Why a table: PostgreSQL cannot DELETE from a view that joins, and cannot
-- TRUNCATE a view at all, so the view of 0001 (events not yet passed, plus
-- parked retries) made pg_net's way of cancelling fail with "cannot delete
-- from view". The table holds one row per request that is not finished: the
-- net.http_* call inserts it next to the request's event, in the caller's
-- transaction (one more insert, as pg_net itself does per request), and the
-- relay deletes it in the transaction that records the request's response
-- in net._http_response. So:
--   * a request whose row is gone when the relay reads its event is not sent
--     (no attempt, no response row), as pg_net skips what is no longer queued;
--   * deleting the row of a request parked for a retry removes the retry
--     (trigger below), so it is not sent again;
--   * a request already on the wire completes and its response is recorded,
--     as in pg_net (which deletes the row when it takes the request).
-- Unlike pg_net's UNLOGGED queue, this one survives a crash, like the log.
-- Direct inserts into the table send nothing: requests are made with the
-- net.http_* functions (the event is what the relay delivers).

create temp table pending_requests on commit drop as select * from net.http_request_queue;
drop view net.http_request_queue;

create table net.http_request_queue (
    id                   bigint primary key,
    method               net.http_method not null,
    url                  text not null,
    headers              jsonb,
    body                 bytea,
    timeout_milliseconds integer not null
);
comment on table net.http_request_queue is
    'pgferry: requests made with net.http_* and not finished yet; delete or truncate rows to cancel them';
insert into net.http_request_queue select * from pending_requests;

grant select, delete on net.http_request_queue to ferry_relay;

---------------------------------------------------------------------------
-- net._queue_request(id, method, url, headers, body, timeout_milliseconds)
--   Inserts the queue row of request `id` (the event net._enqueue published).
--   Returns: nothing. Tables: writes net.http_request_queue.
--   SECURITY DEFINER: a writer may queue requests, not read or change the
--   queue (other requests' URLs and headers). Callers: net._enqueue.
---------------------------------------------------------------------------
create function net._queue_request(id bigint, method text, url text, headers jsonb, body text,
                                   timeout_milliseconds integer) returns void
language sql security definer set search_path = pg_catalog, pg_temp as $$
    insert into net.http_request_queue (id, method, url, headers, body, timeout_milliseconds)
    values (_queue_request.id, _queue_request.method, _queue_request.url, _queue_request.headers,
            convert_to(_queue_request.body, 'UTF8'), _queue_request.timeout_milliseconds)
$$;
revoke execute on function net._queue_request(bigint, text, text, jsonb, text, integer) from public;
grant execute on function net._queue_request(bigint, text, text, jsonb, text, integer) to ferry_writer;

---------------------------------------------------------------------------
-- net._enqueue(method, url, params, headers, body, timeout_milliseconds)
--   Queues one request; it is sent after the calling transaction commits.
--   Returns: the request id (the event's id). Raises: 22023 (bad URL,
--   timeout out of range), 23502 (NULL url or timeout, pg_net's wording).
--   Calls: net._encode_url_with_params_array, ferry._check_headers_map,
--   ferry.publish, net._queue_request.
---------------------------------------------------------------------------
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

---------------------------------------------------------------------------
-- net._encode_url_with_params_array(url, params_array)
--   pg_net's URL check and query building: a URL libcurl would refuse fails
--   here, at the call, with libcurl's words (curl_url_strerror), in pg_net's
--   format `invalid URL "<url>": <reason>`; then each param is appended.
--   Only http and https are accepted (pg_net's worker allows no other
--   protocol). Returns: the URL to request. Raises: 22023.
---------------------------------------------------------------------------
create or replace function net._encode_url_with_params_array(url text, params_array text[]) returns text
language plpgsql immutable as $$
declare
    v_url text := url;
    v_reason text;
    v_authority text;
    v_host text;
    v_port text;
begin
    if url is null or params_array is null then
        return null;
    end if;
    v_authority := substring(url from '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)');
    v_authority := regexp_replace(coalesce(v_authority, ''), '^.*@', '');  -- user:password@ is not the host
    if v_authority ~ '^\[' then
        v_host := substring(v_authority from '^(\[[^]]*\]?)');
        v_port := substring(v_authority from '^\[[^]]*\](?::(.*))?$');
    else
        v_host := split_part(v_authority, ':', 1);
        v_port := nullif(substring(v_authority from ':(.*)$'), '');
    end if;
    if url ~ '[[:cntrl:] ]' then
        v_reason := 'Malformed input to a URL function';
    elsif url !~ '^[A-Za-z][A-Za-z0-9+.-]*:' then
        v_reason := 'Bad scheme';  -- no scheme at all (libcurl >= 7.81; pg_net sets no default scheme)
    elsif url !~* '^https?:' then
        v_reason := 'Unsupported URL scheme';  -- e.g. 'localhost:6666' reads as scheme "localhost"
    elsif url !~* '^https?://' then
        v_reason := 'Unsupported number of slashes following scheme';
    elsif v_host = '' then
        v_reason := 'No host part in the URL';
    elsif v_host ~ '^\[' and v_host !~* '^\[[0-9a-f:.]+\]$' then
        v_reason := 'Bad IPv6 address';
    elsif v_host !~ '^\[' and v_host !~ '^[A-Za-z0-9._~%!$&''()*+,;=-]+$' then
        v_reason := 'Bad hostname';
    elsif v_port is not null and (v_port !~ '^[0-9]{1,5}$' or v_port::integer > 65535) then
        v_reason := 'Port number was not a decimal number between 0 and 65535';
    end if;
    if v_reason is not null then
        raise exception 'invalid URL "%": %', url, v_reason using errcode = '22023';
    end if;
    -- An empty path is written as "/", like libcurl's normalised form.
    if v_url ~* '^https?://[^/?#]+$' then
        v_url := v_url || '/';
    elsif v_url ~* '^https?://[^/?#]+[?#]' then
        v_url := regexp_replace(v_url, '^(https?://[^/?#]+)', '\1/', 'i');
    end if;
    if cardinality(params_array) > 0 then
        v_url := v_url || case when position('?' in v_url) > 0 then '&' else '?' end
                 || array_to_string(params_array, '&');
    end if;
    return v_url;
end $$;

---------------------------------------------------------------------------
-- net._request_is_queued(request_id): whether the request is not finished.
--   SECURITY DEFINER (a writer may ask about its own request ids, not read
--   the queue). Tables: reads net.http_request_queue.
---------------------------------------------------------------------------
create or replace function net._request_is_queued(request_id bigint) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
    select exists (select 1 from net.http_request_queue q where q.id = request_id)
$$;

---------------------------------------------------------------------------
-- net._cancel_requests(): trigger on net.http_request_queue (after DELETE,
--   after TRUNCATE). A request whose row is deleted while it is parked for a
--   retry is not sent again: its retry goes too. (A request not yet read by
--   the relay has no retry; the relay skips it when it finds no row.)
--   Tables: deletes from ferry.retries. SECURITY DEFINER: whoever may cancel
--   requests may do so without rights on pgferry's tables.
---------------------------------------------------------------------------
create function net._cancel_requests() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
    if tg_op = 'TRUNCATE' then
        delete from ferry.retries r where r.subscription = 'pg_net';
    else
        delete from ferry.retries r using cancelled c where r.subscription = 'pg_net' and r.event_id = c.id;
    end if;
    return null;
end $$;
revoke execute on function net._cancel_requests() from public;

create trigger cancel_deleted after delete on net.http_request_queue
    referencing old table as cancelled for each statement execute function net._cancel_requests();
create trigger cancel_truncated after truncate on net.http_request_queue
    for each statement execute function net._cancel_requests();
