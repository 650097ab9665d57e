-- ferry.prune_attempts(max_rows integer default 10000) returns integer
--
-- Retention of the attempt history (bounded, in chunks), relay heartbeats
--
-- Calls:   -
-- Reads:   ferry.config
-- Writes:  ferry.attempts, ferry.relays
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.prune_attempts(max_rows integer default 10000) returns integer
language plpgsql as $$
declare
    n integer;
begin
    delete from ferry.attempts where id in (
        select id from ferry.attempts
        where created_at < now() - (select attempts_retention from ferry.config)
        order by id limit max_rows);
    get diagnostics n = row_count;
    delete from ferry.relays where heartbeat_at < now() - interval '1 hour';
    return n;
end $$;
