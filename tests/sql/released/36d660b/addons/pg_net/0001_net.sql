-- pgferry's pg_net-compatible API (installed by `pgferry install --pg-net`).
--
-- Same schema, function signatures, defaults, types and tables as the pg_net
-- extension, so triggers written for pg_net run unchanged. Underneath, a call
-- appends an event to stream 'net.http' in the caller's transaction; the
-- relay's built-in subscription 'pg_net' sends it after commit with pooled
-- connections and retries, and records the outcome in net._http_response.
-- Unlike pg_net's UNLOGGED queue, pending requests survive a crash.

create schema net;
comment on schema net is 'pgferry: pg_net-compatible API (durable, retried)';

create domain net.http_method as text
    check (value ilike 'get' or value ilike 'post' or value ilike 'delete');

create type net.request_status as enum ('PENDING', 'SUCCESS', 'ERROR');
create type net.http_response as (status_code integer, headers jsonb, body text);
create type net.http_response_result as (status net.request_status, message text, response net.http_response);

-- Filled when a request finishes: a response (any status), or the error after
-- the last attempt. Pruned after ferry.config.net_response_ttl.
create table net._http_response (
    id            bigint,
    status_code   integer,
    content_type  text,
    headers       jsonb,
    content       text,
    timed_out     boolean,
    error_msg     text,
    created       timestamptz not null default now()
);
create index on net._http_response (created);
create unique index _http_response_id_idx on net._http_response (id);

alter table ferry.config add column net_response_ttl interval not null default '6 hours';
alter table ferry.subscriptions add column kind text not null default 'webhook' check (kind in ('webhook', 'pg_net'));

---------------------------------------------------------------------------
-- URL building, as pg_net does it: each param key and value percent-encoded
-- (everything but A-Z a-z 0-9 - . _ ~), appended to the query string.
---------------------------------------------------------------------------

create function net._urlencode_string(string varchar) returns text
language sql immutable parallel safe as $$
    select string_agg(
        case when b between 48 and 57 or b between 65 and 90 or b between 97 and 122 or b in (45, 46, 95, 126)
             then chr(b) else '%' || upper(lpad(to_hex(b), 2, '0')) end, '' order by i)
    from (select get_byte(bytes, i) as b, i
          from (select convert_to(string, 'UTF8') as bytes) s,
               generate_series(0, length(convert_to(string, 'UTF8')) - 1) as i) x
$$;

create function net._encode_url_with_params_array(url text, params_array text[]) returns text
language plpgsql immutable as $$
declare
    v_url text := url;
    v_reason text;
begin
    if url is null or params_array is null then
        return null;
    end if;
    if url !~* '^[a-z][a-z0-9+.-]*://' then
        v_reason := 'No scheme part in the URL (use http:// or https://)';
    elsif url !~* '^https?://' then
        v_reason := 'Unsupported URL scheme ' || substring(url from '^([^:]*)');
    elsif url ~ '\s' then
        v_reason := 'Malformed input to a URL function (it contains whitespace)';
    elsif url !~* '^https?://(\[[0-9a-f:.]+\]|[a-z0-9._~%-]+)(:[0-9]{1,5})?([/?#].*)?$' then
        v_reason := 'Bad hostname or port';
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

-- Queue one request; it is sent after the calling transaction commits.
create function net._enqueue(method text, url text, params jsonb, headers jsonb, body jsonb,
                             timeout_milliseconds integer) returns bigint
language plpgsql as $$
declare
    v_url text;
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
    return ferry.publish('net.http', jsonb_build_object(
        'method', upper(method::net.http_method), 'url', v_url, 'headers', headers,
        'body', case when body is null then null else body::text end,
        'timeout_ms', timeout_milliseconds));
end $$;

create function net.http_get(
    url text,
    params jsonb default '{}'::jsonb,
    headers jsonb default '{}'::jsonb,
    timeout_milliseconds integer default 5000)
returns bigint language sql volatile parallel unsafe as $$
    select net._enqueue('GET', url, params, headers, null, timeout_milliseconds)
$$;

create function net.http_post(
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

create function net.http_delete(
    url text,
    params jsonb default '{}'::jsonb,
    headers jsonb default '{}'::jsonb,
    timeout_milliseconds integer default 5000,
    body jsonb default null)
returns bigint language sql volatile parallel unsafe as $$
    select net._enqueue('DELETE', url, params, headers, body, timeout_milliseconds)
$$;

-- What is queued and not finished yet: in the log and not yet answered, or
-- parked for a retry.
create view net.http_request_queue as
    select e.id, (e.payload ->> 'method')::net.http_method as method, e.payload ->> 'url' as url,
           e.payload -> 'headers' as headers, convert_to(e.payload ->> 'body', 'UTF8') as body,
           (e.payload ->> 'timeout_ms')::integer as timeout_milliseconds
    from ferry.events e
    where e.stream = 'net.http'
      -- not yet passed by the relay (retention may keep passed events for long)
      and not pg_visible_in_snapshot(e.txid, (select t.snapshot from ferry.consumers c join ferry.ticks t on t.id = c.tick_id
                                              where c.name = 'webhook:pg_net'))
      and not exists (select 1 from net._http_response r where r.id = e.id)
    union
    select r.event_id, (r.payload ->> 'method')::net.http_method, r.payload ->> 'url', r.payload -> 'headers',
           convert_to(r.payload ->> 'body', 'UTF8'), (r.payload ->> 'timeout_ms')::integer
    from ferry.retries r
    where r.subscription = 'pg_net' and not exists (select 1 from net._http_response x where x.id = r.event_id);

---------------------------------------------------------------------------
-- Collecting responses
---------------------------------------------------------------------------

create function net._request_is_queued(request_id bigint) returns boolean
language sql stable as $$
    select exists (select 1 from net.http_request_queue q where q.id = request_id)
$$;

-- Unlike pg_net, a request that is queued but not finished reports PENDING
-- (pg_net says ERROR 'request matching request_id not found' for both), and
-- async => false never waits for a request that cannot arrive.
create function net._http_collect_response(request_id bigint, async boolean default true)
returns net.http_response_result language plpgsql volatile as $$
declare
    rec net._http_response;
begin
    if not async then
        if exists (select 1 from ferry.events e where e.id = request_id and e.txid = pg_current_xact_id_if_assigned()) then
            raise exception 'request % was made in this transaction and is only sent after it commits; collect it from another transaction',
                request_id using errcode = '55000';
        end if;
        loop
            select * into rec from net._http_response r where r.id = request_id;
            exit when found or not net._request_is_queued(request_id);
            perform pg_sleep(0.05);
        end loop;
    else
        select * into rec from net._http_response r where r.id = request_id;
    end if;
    if rec.id is null then
        if net._request_is_queued(request_id) then
            return row('PENDING', 'request is queued and not finished yet', null)::net.http_response_result;
        end if;
        return row('ERROR', 'request matching request_id not found', null)::net.http_response_result;
    end if;
    if rec.error_msg is not null then
        return row('ERROR', rec.error_msg, null)::net.http_response_result;
    end if;
    return row('SUCCESS', 'ok', row(rec.status_code, rec.headers, rec.content)::net.http_response)::net.http_response_result;
end $$;

create function net.http_collect_response(request_id bigint, async boolean default true)
returns net.http_response_result language plpgsql volatile as $$
begin
    raise notice 'The net.http_collect_response function is deprecated.';
    return net._http_collect_response(request_id, async);
end $$;

---------------------------------------------------------------------------
-- Worker controls: pgferry's relay plays pg_net's background worker.
---------------------------------------------------------------------------

create function net.check_worker_is_up() returns void
language plpgsql as $$
begin
    if not exists (select 1 from ferry.relays where heartbeat_at > now() - interval '15 seconds') then
        raise exception 'the pg_net background worker is not up'
            using detail = 'no pgferry relay has reported in the last 15 seconds, so requests are queued but not sent',
                  hint = 'start one with `pgferry run --database-url URL`';
    end if;
end $$;

create function net.wake() returns void language sql as $$ select $$;

create function net.worker_restart() returns boolean language sql as $$ select true $$;

create function net.wait_until_running() returns void
language plpgsql as $$
begin
    while not exists (select 1 from ferry.relays where heartbeat_at > now() - interval '15 seconds') loop
        perform pg_sleep(0.1);
    end loop;
end $$;

-- The built-in subscription that sends queued requests. Its retry settings
-- are the knobs: max_attempts => 1 restores pg_net's single attempt.
insert into ferry.subscriptions (name, streams, url, kind, max_in_flight, max_attempts, retry_base_ms, retry_max_ms)
values ('pg_net', array['net.http'], 'http://pg_net.invalid/', 'pg_net', 32, 5, 500, 30000);
select ferry.register_consumer('webhook:pg_net', array['net.http'], 'now');

create function ferry.prune_net_responses(max_rows integer default 10000) returns integer
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
