-- net._http_collect_response(request_id bigint, async boolean default true) returns net.http_response_result
--
-- As before, but the same-transaction check no longer reads ferry.events
-- with the caller's rights.
--
-- Calls:   net._request_in_this_transaction, net._request_is_queued
-- Reads:   net._http_response
-- Writes:  -
-- Raises:  55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

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
