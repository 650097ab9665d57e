-- ferry.next_batch(consumer text, max_events integer default null) returns table (batch_id bigint, start_tick bigint, end_tick bigint, streams text[])
--
-- Hands out the consumer's next batch: from its cursor tick to a later tick,
-- spanning as many ticks as fit in about max_batch_events events. The same
-- batch is handed out again until it is acknowledged with finish_batch().
-- A consumer that retention skipped events for (stalled, with a gap in
-- ferry.gaps since it stalled; migration 0014) gets PF002 naming the gap
-- until ferry.resume_consumer: a reader never goes on past lost events
-- without being told.
--
-- Calls:   -
-- Reads:   ferry.config, ferry.gaps, ferry.ticks
-- Writes:  ferry.consumers
-- Raises:  42704, 55000, PF002
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.next_batch(consumer text, max_events integer default null)
returns table (batch_id bigint, start_tick bigint, end_tick bigint, streams text[])
language plpgsql as $$
declare
    c ferry.consumers;
    v_start_seq bigint;
    v_end bigint;
    v_limit integer := coalesce(max_events, (select max_batch_events from ferry.config));
    g record;
begin
    select * into c from ferry.consumers where name = consumer for update;
    if not found then
        raise exception 'pgferry: consumer % does not exist', quote_literal(consumer) using errcode = '42704',
            hint = 'Create it with ferry.register_consumer(name, streams, start_at) or the Python API.';
    end if;
    if c.stalled_at is not null then
        select sum(gp.events) as events, min(gp.from_tick) as from_tick, max(gp.to_tick) as to_tick,
               min(gp.oldest_event_at) as oldest, max(gp.newest_event_at) as newest
        into g from ferry.gaps gp
        where gp.consumer = next_batch.consumer and gp.updated_at >= c.stalled_at
          and gp.moved_cursor;  -- (a WAL loss moved no cursor: nothing to resume from; migration 0027)
        if g.events is not null then
            raise exception 'pgferry: consumer % is stalled: retention dropped % event(s) of its streams it had not read (ticks % to %, written % to %)',
                quote_literal(consumer), g.events, g.from_tick, g.to_tick,
                to_char(g.oldest, 'YYYY-MM-DD HH24:MI:SSOF'), to_char(g.newest, 'YYYY-MM-DD HH24:MI:SSOF')
                using errcode = 'PF002', detail = c.stalled_reason,
                hint = 'Read on with ferry.resume_consumer(name, ''retained'') (from the oldest event still in the log) '
                       'or ferry.resume_consumer(name, ''now''); ferry.gaps lists what was skipped.';
        end if;
    end if;
    if c.next_tick_id is null then
        select t.event_seq into v_start_seq from ferry.ticks t where t.id = c.tick_id;
        if not found then
            raise exception 'pgferry: the position of consumer % (tick %) is no longer retained', quote_literal(consumer), c.tick_id
                using errcode = '55000', hint = 'Drop it with ferry.unregister_consumer(name) and register it again to start over.';
        end if;
        select max(t.id) into v_end from ferry.ticks t
        where t.id > c.tick_id and t.event_seq <= v_start_seq + v_limit;
        if v_end is null then
            select min(t.id) into v_end from ferry.ticks t where t.id > c.tick_id;
        end if;
        if v_end is null then
            return;
        end if;
        update ferry.consumers set next_tick_id = v_end, batch_id = nextval('ferry.batch_id_seq'), updated_at = now()
        where name = consumer returning * into c;
    end if;
    batch_id := c.batch_id;
    start_tick := c.tick_id;
    end_tick := c.next_tick_id;
    streams := c.streams;
    return next;
end $$;
