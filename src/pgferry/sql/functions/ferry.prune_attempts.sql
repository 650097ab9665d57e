-- ferry.prune_attempts(max_rows integer default 10000) returns integer
--
-- Retention of the attempt history (bounded, in chunks: at most max_rows rows
-- of ferry.attempts and as many of ferry.deliveries), relay heartbeats;
-- returns the rows deleted
--
-- Calls:   -
-- Reads:   ferry.config
-- Writes:  ferry.attempts, ferry.deliveries, ferry.relays
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.prune_attempts(max_rows integer default 10000) returns integer
language plpgsql as $$
declare
    n integer;
    m integer;
begin
    delete from ferry.attempts where id in (
        select id from ferry.attempts
        where created_at < now() - (select attempts_retention from ferry.config)
        order by id limit max_rows);
    get diagnostics n = row_count;
    delete from ferry.deliveries where id in (
        select id from ferry.deliveries
        where created_at < now() - (select attempts_retention from ferry.config)
        order by id limit max_rows);
    get diagnostics m = row_count;
    n := n + m;
    delete from ferry.relays where heartbeat_at < now() - interval '1 hour';
    return n;
end $$;
