-- ferry.webhook_step( subscription text, consumer text, max_events integer, ordered boolean, ack_from bigint, ack_to bigint, event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[], peek boolean, peek_after bigint, epoch bigint default null) returns table (start_tick bigint, end_tick bigint, more boolean, id bigint, stream text, key text, payload text, headers text, created_at timestamptz, blocked boolean)
--
-- One round trip of a webhook worker:
--  1. when ack_to is given: records the attempts of delivered batches and
--     moves the cursor from ack_from to ack_to;
--  2. when peek is true: returns the batch after peek_after (the consumer's
--     cursor when NULL), without opening it, as rows (start_tick, end_tick,
--     more: newer ticks exist beyond end_tick, event...), blocked = true on events of keys that have parked events
--     (an ordered subscription parks those behind them). Only events that
--     pass the subscription's filter are returned (ferry._filter_match,
--     migration 0012), read from the subscription at each call, so a changed
--     filter applies from the next read. A batch with no events for the
--     subscription (none on its streams, or every one filtered out) comes
--     back as one row with a NULL id, so that its range can be acknowledged.
--     No rows: nothing new.
-- With an epoch (the relay's ownership epoch, migration 0016), both steps
-- first check that the consumer still belongs to it (ferry._fence), and raise
-- PF002 when another relay claimed it since.
--
-- Calls:   ferry._batch_end, ferry._fence, ferry._filter_match, ferry.advance_consumer, ferry.batch_events
-- Reads:   ferry.consumers, ferry.retries, ferry.subscriptions, ferry.ticks
-- Writes:  ferry.attempts
-- Raises:  42704, 55000, PF001, PF002
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.webhook_step(
    subscription text, consumer text, max_events integer, ordered boolean,
    ack_from bigint, ack_to bigint, event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[],
    peek boolean, peek_after bigint, epoch bigint default null)
returns table (start_tick bigint, end_tick bigint, more boolean, id bigint, stream text, key text, payload text,
               headers text, created_at timestamptz, blocked boolean)
language plpgsql as $$
declare
    v_start bigint;
    v_end bigint;
    v_more boolean;
    v_streams text[];
    v_filter jsonpath;
begin
    if epoch is not null and (ack_to is not null or not exists (
            select 1 from ferry.consumers c where c.name = consumer and c.owner_epoch = epoch)) then
        perform ferry._fence(consumer, epoch);  -- an acknowledgement holds the row until commit
    end if;
    if ack_to is not null then
        insert into ferry.attempts (subscription, event_id, attempt, status, latency_ms)
        select webhook_step.subscription, u.e, u.a, u.s, u.l
        from unnest(event_ids, attempt_nos, statuses, latencies) as u(e, a, s, l);
        perform ferry.advance_consumer(consumer, ack_from, ack_to);
    end if;
    if not peek then
        return;
    end if;
    select coalesce(peek_after, c.tick_id), c.streams, s.filter::jsonpath into v_start, v_streams, v_filter
    from ferry.consumers c left join ferry.subscriptions s on s.name = webhook_step.subscription
    where c.name = consumer;
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
        from ferry.batch_events(v_start, v_end, v_streams, consumer) e
        where ferry._filter_match(v_filter, e.stream, e.key, e.headers, e.payload);
    if not found then
        return query select v_start, v_end, v_more, null::bigint, null::text, null::text, null::text, null::text,
                            null::timestamptz, false;
    end if;
end $$;
