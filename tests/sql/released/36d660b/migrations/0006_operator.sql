-- pgferry 0006: what operators need to see and fix delivery.
--
-- * ferry.subscriptions.managed_by: who manages a subscription declaratively
--   (`pgferry apply` writes 'apply'), so that applying a file only ever
--   removes subscriptions that an earlier apply created, never ones made by
--   hand or by SQL (unless asked to with --prune).
-- * ferry.lookup_event: one event as readers see it (captured rows with their
--   envelope), for `pgferry trace` and the dashboard's trace page.
-- * ferry.replay / ferry.replay_count: put events of the retained log that a
--   subscription has already passed back in line for delivery, in chunks of
--   tick ranges, so a long replay reads the log once, shows progress and
--   never holds one huge transaction.

alter table ferry.subscriptions add column managed_by text;

comment on column ferry.subscriptions.managed_by is
    'Set by `pgferry apply` (''apply''): such subscriptions are removed when they leave the file. NULL: made by hand.';

create function ferry.lookup_event(event_id bigint)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language sql stable as $$
    select e.id, e.txid, e.stream, e.key,
           ferry._envelope(e.op, e.payload, e.old_payload, c.schema_name, c.table_name),
           e.headers, e.created_at
    from ferry.events e left join ferry.captures c on c.id = e.capture
    where e.id = lookup_event.event_id
$$;

-- The retained events of a subscription's streams that its cursor has passed,
-- i.e. committed after the opening tick of the oldest retained partition and
-- visible at the subscription's cursor tick. Events after the cursor are not
-- replayed: the live stream delivers them anyway.
create function ferry._replayable(p_subscription text, p_since timestamptz, p_from_event bigint)
returns table (id bigint, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language plpgsql stable as $$
declare
    v_streams text[];
    v_from bigint;
    v_to bigint;
begin
    select s.streams into v_streams from ferry.subscriptions s where s.name = p_subscription;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(p_subscription) using errcode = '42704';
    end if;
    if (p_since is null) = (p_from_event is null) then
        raise exception 'pgferry: replay needs exactly one of since (a time) or from_event (an event id)'
            using errcode = '22023';
    end if;
    select c.tick_id into v_to from ferry.consumers c where c.name = 'webhook:' || p_subscription;
    select min(p.open_tick) into v_from from ferry.partitions p where p.state <> 'empty';
    if v_to is null or v_from is null or v_from >= v_to then
        return;
    end if;
    return query
        select e.id, e.stream, e.key, e.payload, e.headers, e.created_at
        from ferry.batch_events(v_from, v_to, v_streams) e
        where (p_from_event is null or e.id >= p_from_event)
          and (p_since is null or e.created_at >= p_since);
end $$;

create function ferry.replay_count(subscription text, since timestamptz default null, from_event bigint default null)
returns bigint language sql stable as $$
    select count(*) from ferry._replayable(subscription, since, from_event)
$$;

-- One chunk of a replay. A replay walks the log's tick ranges from the oldest
-- retained partition's opening tick up to the subscription's cursor as it was
-- when the replay started (until_tick), a range of about max_rows events at a
-- time (sized from the event sequence stored with each tick, as next_batch
-- does), so that the whole replay reads the retained log once. Matching events
-- are parked for immediate delivery (attempts 0, next_attempt_at now), where
-- the subscription's retry loop picks them up. Events already parked or
-- dead-lettered for the subscription are skipped (dead letters come back with
-- `pgferry dlq replay`). Call it with after_tick and until_tick NULL first,
-- then with the last_tick and end_tick it returned, until last_tick is NULL.
-- If retention removed the range being walked in the meantime, the walk goes
-- on from what is still retained.
create function ferry.replay(
    subscription text, since timestamptz default null, from_event bigint default null,
    after_tick bigint default null, until_tick bigint default null, max_rows integer default 1000)
returns table (queued bigint, skipped bigint, last_tick bigint, end_tick bigint)
language plpgsql as $$
declare
    v_sub text := replay.subscription;
    v_streams text[];
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
    select s.streams into v_streams from ferry.subscriptions s where s.name = v_sub;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(v_sub) using errcode = '42704';
    end if;
    if v_until is null then
        select c.tick_id into v_until from ferry.consumers c where c.name = 'webhook:' || v_sub;
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
        select e.* from ferry.batch_events(v_start, v_end, v_streams) e
        where (from_event is null or e.id >= from_event)
          and (since is null or e.created_at >= since)
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

-- Recent failures (dashboard, `pgferry status`) without walking past every
-- success: only failed attempts are indexed, so the index stays small.
create index attempts_failed_idx on ferry.attempts (id) where error_class is not null;
