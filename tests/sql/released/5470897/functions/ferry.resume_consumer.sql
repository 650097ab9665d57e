-- ferry.resume_consumer(name text, from_position text) returns bigint
--
-- Ends a consumer's stall (migration 0014) and says where it reads on:
-- 'retained', from where retention left its cursor (the oldest tick still
-- in the log: every event retained is read); 'now', from the newest tick
-- (the events in between are skipped, and recorded in ferry.gaps with cause
-- 'resumed from now'). Works on a consumer that is not stalled too ('now'
-- then skips its backlog, recorded the same way). Returns the events
-- skipped by this call.
--
-- Calls:   ferry._skip_to
-- Reads:   ferry.consumers, ferry.ticks
-- Writes:  ferry.consumers (and what ferry._skip_to writes)
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.resume_consumer(name text, from_position text) returns bigint
language plpgsql as $$
declare
    v_n bigint := 0;
    v_newest bigint;
begin
    if from_position is null or from_position not in ('retained', 'now') then
        raise exception 'pgferry: from_position must be ''retained'' (the oldest events still in the log) or ''now'', got %',
            coalesce(quote_literal(from_position), 'NULL') using errcode = '22023';
    end if;
    if not exists (select 1 from ferry.consumers c where c.name = resume_consumer.name) then
        raise exception 'pgferry: consumer % does not exist', quote_literal(name) using errcode = '42704';
    end if;
    if from_position = 'now' then
        select max(t.id) into v_newest from ferry.ticks t;
        v_n := ferry._skip_to(name, v_newest, null, 'resumed from now', 'resumed from now by an operator');
    end if;
    update ferry.consumers c set stalled_at = null, stalled_reason = null, retention_level = 0, updated_at = now()
    where c.name = resume_consumer.name;
    return v_n;
end $$;
