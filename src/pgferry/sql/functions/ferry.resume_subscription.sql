-- ferry.resume_subscription(name text) returns void
--
-- Resumes a paused or disabled subscription.
--
-- Calls:   ferry._set_subscription_state
-- Reads:   -
-- Writes:  -
-- Raises:  42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.resume_subscription(name text) returns void
language sql as $$ select ferry._set_subscription_state(name, 'active', null) $$;
