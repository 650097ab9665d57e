-- ferry.pause_subscription(name text) returns void
--
-- Pauses a subscription: relays stop delivering it; its cursor stays, so
-- nothing is skipped when it is resumed.
--
-- Calls:   ferry._set_subscription_state
-- Reads:   -
-- Writes:  -
-- Raises:  42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.pause_subscription(name text) returns void
language sql as $$ select ferry._set_subscription_state(name, 'paused', 'paused by an operator') $$;
