-- net._queue_request(id bigint, method text, url text, headers jsonb, body text, timeout_milliseconds integer) returns void
--
-- Inserts the queue row of request `id` (the event net._enqueue published),
-- which DELETE or TRUNCATE on net.http_request_queue can then cancel.
-- SECURITY DEFINER: a writer may queue requests, not read or change the
-- queue (other requests' URLs and headers). Only the id this session drew
-- last (the event net._enqueue has just published): a writer that queued
-- rows under ids not drawn yet made every later net.http_* call of every
-- session fail on the queue's primary key (outside probe).
--
-- Calls:   -
-- Reads:   -
-- Writes:  net.http_request_queue
-- Raises:  42501, 55000
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: ferry_writer (not PUBLIC)

create or replace function net._queue_request(id bigint, method text, url text, headers jsonb, body text,
                                   timeout_milliseconds integer) returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
    if _queue_request.id is distinct from currval('ferry.event_id_seq') then
        raise exception 'pgferry: net._queue_request queues only the request net._enqueue has just published'
            using errcode = '42501', hint = 'Call net.http_get, net.http_post or net.http_delete.';
    end if;
    insert into net.http_request_queue (id, method, url, headers, body, timeout_milliseconds)
    values (_queue_request.id, _queue_request.method, _queue_request.url, _queue_request.headers,
            convert_to(_queue_request.body, 'UTF8'), _queue_request.timeout_milliseconds);
end $$;

revoke execute on function net._queue_request(bigint, text, text, jsonb, text, integer) from public;

grant execute on function net._queue_request(bigint, text, text, jsonb, text, integer) to ferry_writer;
