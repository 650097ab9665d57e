-- pgferry's pg_net-compatible API (installed by `pgferry install --pg-net`).
--
-- Same schema, function signatures, defaults, types and tables as the pg_net
-- extension, so triggers written for pg_net run unchanged. Underneath, a call
-- appends an event to stream 'net.http' in the caller's transaction; the
-- relay's built-in subscription 'pg_net' sends it after commit with pooled
-- connections and retries, and records the outcome in net._http_response.
-- Unlike pg_net's UNLOGGED queue, pending requests survive a crash.
--
-- The functions of the API are in addons/pg_net/functions/ (applied after
-- these migrations by every `pgferry install`).

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

-- net.http_request_queue, pg_net's request queue, is created by
-- 0004_request_queue.sql (a table; until 0004 it was a view over the log).

-- The built-in subscription that sends queued requests. Its retry settings
-- are the knobs: max_attempts => 1 restores pg_net's single attempt.
insert into ferry.subscriptions (name, streams, url, kind, max_in_flight, max_attempts, retry_base_ms, retry_max_ms)
values ('pg_net', array['net.http'], 'http://pg_net.invalid/', 'pg_net', 32, 5, 500, 30000);

select ferry.register_consumer('webhook:pg_net', array['net.http'], 'now');
