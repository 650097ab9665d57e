-- ferry._written_since(tick bigint) returns boolean
--
-- Whether an event id was drawn since tick was recorded (the event counter
-- moved past its event_seq): something was written that a later tick may
-- carry, committed or not. Two lookups; the ticker asks it while a fence
-- waits for WAL capture, to know whether to look again soon.
--
-- Calls:   -
-- Reads:   ferry.event_id_seq, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._written_since(tick bigint) returns boolean
language sql stable as $$
    select coalesce((select case when s.is_called then s.last_value else 0 end from ferry.event_id_seq s)
                    <> (select t.event_seq from ferry.ticks t where t.id = tick), true)
$$;
