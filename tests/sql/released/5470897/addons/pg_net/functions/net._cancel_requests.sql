-- net._cancel_requests() returns trigger
--
-- The triggers below run it after DELETE and TRUNCATE on
-- net.http_request_queue: a request whose row is deleted while it is parked
-- for a retry is not sent again, its retry goes too. (A request not yet read
-- by the relay has no retry; the relay skips it when it finds no row.)
-- SECURITY DEFINER: whoever may cancel requests may do so without rights on
-- pgferry's tables.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.retries
-- Raises:  -
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: none: a trigger function (EXECUTE revoked from PUBLIC)

create or replace function net._cancel_requests() returns trigger
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

create or replace trigger cancel_deleted after delete on net.http_request_queue
    referencing old table as cancelled for each statement execute function net._cancel_requests();

create or replace trigger cancel_truncated after truncate on net.http_request_queue
    for each statement execute function net._cancel_requests();
