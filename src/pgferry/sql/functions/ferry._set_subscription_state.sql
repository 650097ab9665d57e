-- ferry._set_subscription_state(p_name text, p_state text, p_reason text) returns void
--
-- Sets a subscription's state (active, paused, disabled) and the reason
-- shown by `pgferry status`; 42704 when it does not exist. Any state but
-- active is also notified on pgferry_paused (the subscription's name), on
-- which the relay delivering it stops its workers at once: it learned of a
-- pause only at its next ownership round, up to 2 s later, and events
-- committed after `pgferry subscription pause` returned were still
-- delivered (outside probe). Requests already on the wire finish.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.subscriptions; NOTIFY pgferry_paused
-- Raises:  42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._set_subscription_state(p_name text, p_state text, p_reason text) returns void
language plpgsql as $$
begin
    update ferry.subscriptions set state = p_state, state_reason = p_reason, updated_at = now() where name = p_name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(p_name) using errcode = '42704';
    end if;
    if p_state <> 'active' then
        perform pg_notify('pgferry_paused', p_name);
    end if;
end $$;
