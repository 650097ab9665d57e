-- ferry.unsubscribe(name text) returns boolean
--
-- Deletes a subscription with its consumer, parked retries and dead letters
-- (attempt history stays until pruned). Returns whether it existed.
--
-- Calls:   ferry.unregister_consumer
-- Reads:   -
-- Writes:  ferry.subscriptions
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.unsubscribe(name text) returns boolean
language plpgsql as $$
begin
    perform ferry.unregister_consumer('webhook:' || unsubscribe.name);
    delete from ferry.subscriptions s where s.name = unsubscribe.name;
    return found;
end $$;
