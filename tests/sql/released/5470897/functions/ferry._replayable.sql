-- ferry._replayable(p_subscription text, p_since timestamptz, p_from_event bigint) returns table (id bigint, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
--
-- The retained events of a subscription's streams that its cursor has passed,
-- i.e. committed after the opening tick of the oldest retained partition and
-- visible at the subscription's cursor tick. Events after the cursor are not
-- replayed: the live stream delivers them anyway. Events the subscription's
-- filter does not match (as it is now) are not replayable.
--
-- Calls:   ferry._filter_match, ferry.batch_events
-- Reads:   ferry.consumers, ferry.partitions, ferry.subscriptions
-- Writes:  -
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._replayable(p_subscription text, p_since timestamptz, p_from_event bigint)
returns table (id bigint, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language plpgsql stable as $$
declare
    v_streams text[];
    v_filter jsonpath;
    v_from bigint;
    v_to bigint;
begin
    select s.streams, s.filter::jsonpath into v_streams, v_filter
    from ferry.subscriptions s where s.name = p_subscription;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(p_subscription) using errcode = '42704';
    end if;
    if (p_since is null) = (p_from_event is null) then
        raise exception 'pgferry: replay needs exactly one of since (a time) or from_event (an event id)'
            using errcode = '22023';
    end if;
    -- its slowest partition's cursor: every event up to it is passed (migration 0018)
    select min(c.tick_id) into v_to from ferry.consumers c where c.subscription = p_subscription;
    select min(p.open_tick) into v_from from ferry.partitions p where p.state <> 'empty';
    if v_to is null or v_from is null or v_from >= v_to then
        return;
    end if;
    return query
        select e.id, e.stream, e.key, e.payload, e.headers, e.created_at
        from ferry.batch_events(v_from, v_to, v_streams, 'webhook:' || p_subscription) e
        where (p_from_event is null or e.id >= p_from_event)
          and (p_since is null or e.created_at >= p_since)
          and ferry._filter_match(v_filter, e.stream, e.key, e.headers, e.payload);
end $$;
