-- ferry.unsubscribe(name text) returns boolean
--
-- Deletes a subscription with its consumers (one per partition), parked retries and dead letters
-- (attempt history stays until pruned). Returns whether it existed.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers, ferry.subscriptions
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.unsubscribe(name text) returns boolean
language plpgsql as $$
begin
    delete from ferry.consumers c where c.subscription = unsubscribe.name or c.name = 'webhook:' || unsubscribe.name;
    delete from ferry.subscriptions s where s.name = unsubscribe.name;
    return found;
end $$;
