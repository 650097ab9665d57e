-- ferry.replay( subscription text, since timestamptz default null, from_event bigint default null, after_tick bigint default null, until_tick bigint default null, max_rows integer default 1000) returns table (queued bigint, skipped bigint, last_tick bigint, end_tick bigint)
--
-- One chunk of a replay. A replay walks the log's tick ranges from the oldest
-- retained partition's opening tick up to the subscription's cursor (its slowest partition's) as it was
-- when the replay started (until_tick), a range of about max_rows events at a
-- time (sized from the event sequence stored with each tick, as next_batch
-- does), so that the whole replay reads the retained log once. Matching events
-- are parked for immediate delivery (attempts 0, next_attempt_at now), where
-- the subscription's retry loop picks them up. Events already parked or
-- dead-lettered for the subscription are skipped (dead letters come back with
-- `pgferry dlq replay`), and so are events its filter (as it is now) does not
-- match: a replay sends what the subscription would deliver. Call it with
-- after_tick and until_tick NULL first, then with the last_tick and end_tick
-- it returned, until last_tick is NULL.
-- If retention removed the range being walked in the meantime, the walk goes
-- on from what is still retained.
--
-- Calls:   ferry._filter_match, ferry.batch_events
-- Reads:   ferry.consumers, ferry.dead_letters, ferry.partitions, ferry.subscriptions, ferry.ticks
-- Writes:  ferry.retries
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.replay(
    subscription text, since timestamptz default null, from_event bigint default null,
    after_tick bigint default null, until_tick bigint default null, max_rows integer default 1000)
returns table (queued bigint, skipped bigint, last_tick bigint, end_tick bigint)
language plpgsql as $$
declare
    v_sub text := replay.subscription;
    v_streams text[];
    v_filter jsonpath;
    v_until bigint := replay.until_tick;
    v_start bigint := replay.after_tick;
    v_start_seq bigint;
    v_end bigint;
begin
    if max_rows is null or max_rows < 1 then
        raise exception 'pgferry: max_rows must be at least 1, got %', max_rows using errcode = '22023';
    end if;
    if (since is null) = (from_event is null) then
        raise exception 'pgferry: replay needs exactly one of since (a time) or from_event (an event id)'
            using errcode = '22023';
    end if;
    select s.streams, s.filter::jsonpath into v_streams, v_filter
    from ferry.subscriptions s where s.name = v_sub;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(v_sub) using errcode = '42704';
    end if;
    if v_until is null then
        -- its slowest partition's cursor: every event up to it is passed (migration 0018)
        select min(c.tick_id) into v_until from ferry.consumers c where c.subscription = v_sub;
    end if;
    if v_start is null or not exists (select 1 from ferry.ticks t where t.id = v_start) then
        select greatest(min(p.open_tick), v_start) into v_start from ferry.partitions p where p.state <> 'empty';
    end if;
    select t.event_seq into v_start_seq from ferry.ticks t where t.id = v_start;
    if v_until is null or v_start_seq is null or v_start >= v_until then
        return query select 0::bigint, 0::bigint, null::bigint, v_until;
        return;
    end if;
    select max(t.id) into v_end from ferry.ticks t
    where t.id > v_start and t.id <= v_until and t.event_seq <= v_start_seq + max_rows;
    if v_end is null then
        select min(t.id) into v_end from ferry.ticks t where t.id > v_start and t.id <= v_until;
    end if;
    if v_end is null then
        return query select 0::bigint, 0::bigint, null::bigint, v_until;
        return;
    end if;
    return query
    with picked as (
        select e.* from ferry.batch_events(v_start, v_end, v_streams, 'webhook:' || v_sub) e
        where (from_event is null or e.id >= from_event)
          and (since is null or e.created_at >= since)
          and ferry._filter_match(v_filter, e.stream, e.key, e.headers, e.payload)
    ), queued as (
        insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                                   attempts, first_failed_at, next_attempt_at, last_error)
        select v_sub, p.id, p.stream, p.key, p.payload, p.headers, p.created_at, 0, now(), now(), 'replayed by an operator'
        from picked p
        where not exists (select 1 from ferry.dead_letters d where d.subscription = v_sub and d.event_id = p.id)
        on conflict do nothing
        returning 1
    )
    select (select count(*) from queued), (select count(*) from picked) - (select count(*) from queued), v_end, v_until;
end $$;
