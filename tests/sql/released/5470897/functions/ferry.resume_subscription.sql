-- ferry.resume_subscription(name text, from_position text default null) returns void
--
-- Resumes a paused, disabled or stalled subscription. A stalled one
-- (retention skipped events for it, migration 0014) must say where it reads
-- on, as ferry.resume_consumer: from_position 'retained' (every event still
-- in the log, from the oldest) or 'now' (the retained backlog skipped,
-- recorded in ferry.gaps; `pgferry replay` can still send it). Without it,
-- a stalled subscription is refused with 55000, so nobody resumes past a
-- gap without seeing it.
--
-- Calls:   ferry._set_subscription_state, ferry.resume_consumer
-- Reads:   ferry.consumers, ferry.gaps, ferry.subscriptions
-- Writes:  ferry.subscriptions (and what ferry.resume_consumer writes)
-- Raises:  22023, 42704, 55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.resume_subscription(name text, from_position text default null) returns void
language plpgsql as $$
declare
    v_state text;
    v_reason text;
begin
    select s.state, s.state_reason into v_state, v_reason from ferry.subscriptions s where s.name = resume_subscription.name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(name) using errcode = '42704';
    end if;
    if from_position is null and v_state = 'stalled' then
        raise exception 'pgferry: subscription % is stalled: %', quote_literal(name), v_reason
            using errcode = '55000',
                  hint = 'Say where it reads on: from_position => ''retained'' (every event still in the log) or ''now''.';
    end if;
    if from_position is not null then
        -- every partition of it (migration 0018)
        perform ferry.resume_consumer(c.name, from_position)
        from ferry.consumers c where c.subscription = resume_subscription.name;
    end if;
    perform ferry._set_subscription_state(name, 'active', null);
end $$;
