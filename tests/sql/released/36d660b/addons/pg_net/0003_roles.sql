-- The pg_net-compatible API for ferry_writer, and what the relay needs of it.
--
-- A writer calls net.http_get/post/delete (which publish through the
-- SECURITY DEFINER ferry.publish) and reads net._http_response, as pg_net
-- users do; it does not read the request queue (other requests' URLs and
-- headers) or the log. The few functions that must look at those to answer a
-- writer (is a request still queued? was it made in this transaction? is a
-- relay up?) run as their owner, with a pinned search_path, and return only
-- a yes/no.

grant usage on schema net to ferry_writer, ferry_relay;
grant select on net._http_response to ferry_writer;
grant select, insert, update, delete on net._http_response to ferry_relay;
grant select on net.http_request_queue to ferry_relay;

alter function net._request_is_queued(bigint) security definer set search_path = pg_catalog, pg_temp;
alter function net.check_worker_is_up() security definer set search_path = pg_catalog, pg_temp;
alter function net.wait_until_running() security definer set search_path = pg_catalog, pg_temp;

create function net._request_in_this_transaction(request_id bigint) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
    select exists (select 1 from ferry.events e where e.id = request_id and e.txid = pg_current_xact_id_if_assigned())
$$;

-- As before, but the same-transaction check no longer reads ferry.events
-- with the caller's rights.
create or replace function net._http_collect_response(request_id bigint, async boolean default true)
returns net.http_response_result language plpgsql volatile as $$
declare
    rec net._http_response;
begin
    if not async then
        if net._request_in_this_transaction(request_id) then
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

-- Supabase Database Webhooks: the trigger runs as the writer and records each hook.
grant usage on schema supabase_functions to ferry_writer, ferry_relay;
grant insert on supabase_functions.hooks to ferry_writer;
grant usage on sequence supabase_functions.hooks_id_seq to ferry_writer;
grant select on supabase_functions.hooks to ferry_relay;
