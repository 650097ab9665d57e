-- pgferry pg_net add-on 0004: net.http_request_queue is a table again, so
-- `delete from net.http_request_queue where ...` and `truncate
-- net.http_request_queue` cancel requests, as pg_net users do; and invalid
-- URLs fail with libcurl's own words, as pg_net's do.
--
-- Replaces the view net.http_request_queue of databases installed before it
-- (its rows, the requests still queued then, are kept). The functions it
-- changed (net._enqueue, net._encode_url_with_params_array,
-- net._request_is_queued) and the new ones (net._queue_request,
-- net._cancel_requests, with the triggers) are in functions/.
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

create temp table pending_requests (
    id bigint, method net.http_method, url text, headers jsonb, body bytea, timeout_milliseconds integer
) on commit drop;

do $$
begin
    if exists (select 1 from pg_views where schemaname = 'net' and viewname = 'http_request_queue') then
        insert into pending_requests select * from net.http_request_queue;
        drop view net.http_request_queue;
    end if;
end $$;

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
