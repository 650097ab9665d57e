-- ferry._batch_split(start_tick bigint, end_tick bigint, streams text[], reader text, done_id bigint, last_id bigint) returns bigint
--
-- Where a read that a byte bound cut short may end (ferry.webhook_step,
-- migration 0015). The read took the events of the range (start_tick,
-- end_tick] with ids in (done_id, last_id], in id order; earlier reads of
-- the same range took those with ids up to done_id (NULL: none), and some
-- event of the range has an id above last_id (the read was cut). Returns
-- the furthest tick t of the range such that
--   (a) no event of (start_tick, t] has an id above last_id: every event
--       committed by t has been read, now or before, and
--   (b) every event of the range with id up to done_id is committed by t:
--       nothing read before belongs after t, where the next read starts,
-- or start_tick when there is none (the read is part of the range, and the
-- cursor stays put until the range's last part). Both conditions change
-- at most once as t grows ((a) true then false, (b) false then true: a
-- transaction seen committed stays committed), so (a) is a binary search
-- over the range's ticks (about log2(ticks) index scans of ids, without
-- payloads) and (b) one check at the tick (a) allows. The caller returns only the events it read that commit by t;
-- the others come again in the next range.
--
-- Calls:   ferry.batch_events
-- Reads:   ferry.captures, ferry.events, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._batch_split(start_tick bigint, end_tick bigint, streams text[], reader text,
                                              done_id bigint, last_id bigint) returns bigint
language plpgsql stable as $$
declare
    v_ticks bigint[];
    v_n integer;
    v_lo integer;
    v_hi integer;
    v_mid integer;
    v_last_whole integer;  -- furthest index where (a) holds (0: start_tick)
begin
    select coalesce(array_agg(t.id order by t.id), '{}') into v_ticks
    from ferry.ticks t where t.id > start_tick and t.id <= end_tick;
    v_n := coalesce(array_length(v_ticks, 1), 0);
    -- (a): holds at 0 (nothing committed in (start_tick, start_tick]), and not at end_tick
    -- (index v_n): the read was cut, so an event of the range has an id above last_id. A range
    -- of one tick (the first after a relay was down) so costs no scan at all.
    v_lo := 0;
    v_hi := v_n;
    while v_hi - v_lo > 1 loop
        v_mid := (v_lo + v_hi) / 2;
        if exists (select 1 from ferry.batch_events(start_tick, v_ticks[v_mid], streams, reader) e
                   where e.id > last_id) then
            v_hi := v_mid;
        else
            v_lo := v_mid;
        end if;
    end loop;
    v_last_whole := v_lo;
    if v_last_whole = 0 then
        return start_tick;
    end if;
    -- (b) at the furthest tick (a) allows: it holds there or nowhere before.
    if done_id is not null
       and exists (select 1 from ferry.batch_events(v_ticks[v_last_whole], end_tick, streams, reader) e
                   where e.id <= done_id) then
        return start_tick;
    end if;
    return v_ticks[v_last_whole];
end $$;
