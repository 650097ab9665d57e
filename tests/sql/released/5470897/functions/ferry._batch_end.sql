-- ferry._batch_end(after_tick bigint, max_events integer) returns bigint
--
-- The furthest tick after after_tick that keeps the batch at about
-- max_events events (at least the next tick), or NULL when there is none.
--
-- Calls:   -
-- Reads:   ferry.config, ferry.ticks
-- Writes:  -
-- Raises:  55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._batch_end(after_tick bigint, max_events integer) returns bigint
language plpgsql stable as $$
declare
    v_start_seq bigint;
    v_end bigint;
begin
    select t.event_seq into v_start_seq from ferry.ticks t where t.id = after_tick;
    if not found then
        raise exception 'pgferry: tick % is no longer retained', after_tick using errcode = '55000',
            hint = 'The consumer fell behind retention; drop it with ferry.unregister_consumer(name) and register it again.';
    end if;
    select max(t.id) into v_end from ferry.ticks t
    where t.id > after_tick and t.event_seq <= v_start_seq + coalesce(max_events, (select max_batch_events from ferry.config));
    if v_end is null then
        select min(t.id) into v_end from ferry.ticks t where t.id > after_tick;
    end if;
    return v_end;
end $$;
