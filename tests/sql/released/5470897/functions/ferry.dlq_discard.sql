-- ferry.dlq_discard(subscription text, ids bigint[] default null) returns integer
--
-- Deletes a subscription's dead letters (all, or those with the given ids).
-- Returns how many.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.dead_letters
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.dlq_discard(subscription text, ids bigint[] default null) returns integer
language plpgsql as $$
declare
    n integer;
begin
    delete from ferry.dead_letters d
    where d.subscription = dlq_discard.subscription and (ids is null or d.id = any (ids));
    get diagnostics n = row_count;
    return n;
end $$;
