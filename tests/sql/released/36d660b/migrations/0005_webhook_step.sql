-- pgferry 0005: webhook batches are pipelined, one round trip per batch.
--
-- A webhook worker used to take one batch at a time: open it, send it,
-- record it and acknowledge it, and only then open the next; under load the
-- waits for the database and the endpoint added up in the commit-to-receipt
-- tail. Now a worker reads a batch ahead (ferry.webhook_step with peek) while
-- earlier ones are still being sent, and moves the consumer's cursor over
-- finished batches strictly in order, in the same call that reads the next
-- one. Nothing changes for the guarantee: the cursor only passes a batch
-- whose every event was delivered, parked or dead-lettered; a crash re-sends
-- whatever the cursor had not passed, with the same webhook-ids.

-- The furthest tick after after_tick that keeps the batch at about
-- max_events events (at least the next tick), or NULL when there is none.
create function ferry._batch_end(after_tick bigint, max_events integer) returns bigint
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

-- Moves consumer's cursor from from_tick to to_tick, dropping any batch it
-- had open. Raises PF001 when the cursor is not at from_tick: another
-- process moved it (two relays briefly delivering one subscription), and
-- the caller must start over from wherever the cursor is now.
create function ferry.advance_consumer(consumer text, from_tick bigint, to_tick bigint) returns void
language plpgsql as $$
begin
    update ferry.consumers set tick_id = to_tick, next_tick_id = null, batch_id = null, updated_at = now()
    where name = consumer and tick_id = from_tick;
    if not found then
        raise exception 'pgferry: consumer % is no longer at tick %', quote_literal(consumer), from_tick
            using errcode = 'PF001', hint = 'Another process moved it; read again from its current position.';
    end if;
end $$;

-- One round trip of a webhook worker:
--  1. when ack_to is given: records the attempts of delivered batches and
--     moves the cursor from ack_from to ack_to;
--  2. when peek is true: returns the batch after peek_after (the consumer's
--     cursor when NULL), without opening it, as rows (start_tick, end_tick,
--     more: newer ticks exist beyond end_tick, event...), blocked = true on events of keys that have parked events
--     (an ordered subscription parks those behind them). A batch with no
--     events for the subscription comes back as one row with a NULL id, so
--     that its range can be acknowledged. No rows: nothing new.
create function ferry.webhook_step(
    subscription text, consumer text, max_events integer, ordered boolean,
    ack_from bigint, ack_to bigint, event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[],
    peek boolean, peek_after bigint)
returns table (start_tick bigint, end_tick bigint, more boolean, id bigint, stream text, key text, payload text,
               headers text, created_at timestamptz, blocked boolean)
language plpgsql as $$
declare
    v_start bigint;
    v_end bigint;
    v_more boolean;
    v_streams text[];
begin
    if ack_to is not null then
        insert into ferry.attempts (subscription, event_id, attempt, status, latency_ms)
        select webhook_step.subscription, u.e, u.a, u.s, u.l
        from unnest(event_ids, attempt_nos, statuses, latencies) as u(e, a, s, l);
        perform ferry.advance_consumer(consumer, ack_from, ack_to);
    end if;
    if not peek then
        return;
    end if;
    select coalesce(peek_after, c.tick_id), c.streams into v_start, v_streams
    from ferry.consumers c where c.name = consumer;
    if not found then
        raise exception 'pgferry: consumer % does not exist', quote_literal(consumer) using errcode = '42704';
    end if;
    v_end := ferry._batch_end(v_start, max_events);
    if v_end is null then
        return;
    end if;
    v_more := exists (select 1 from ferry.ticks t where t.id > v_end);
    return query
        select v_start, v_end, v_more, e.id, e.stream, e.key, e.payload::text, e.headers::text, e.created_at,
               ordered and e.key is not null
               and exists (select 1 from ferry.retries r where r.subscription = webhook_step.subscription and r.key = e.key)
        from ferry.batch_events(v_start, v_end, v_streams) e;
    if not found then
        return query select v_start, v_end, v_more, null::bigint, null::text, null::text, null::text, null::text,
                            null::timestamptz, false;
    end if;
end $$;

-- Superseded by webhook_step.
drop function ferry.next_webhook_batch(text, integer);
drop function ferry.record_delivered_batch(text, text, bigint, bigint[], integer[], integer[], real[]);
