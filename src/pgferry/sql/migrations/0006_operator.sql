-- pgferry 0006: what operators need to see and fix delivery.
--
-- * ferry.subscriptions.managed_by: who manages a subscription declaratively
--   (`pgferry apply` writes 'apply'), so that applying a file only ever
--   removes subscriptions that an earlier apply created, never ones made by
--   hand or by SQL (unless asked to with --prune).
-- * ferry.lookup_event: one event as readers see it (captured rows with their
--   envelope), for `pgferry trace` and the dashboard's trace page.
-- * ferry.replay / ferry.replay_count: put events of the retained log that a
--   subscription has already passed back in line for delivery, in chunks, so
--   a long replay shows progress and never holds one huge transaction.

alter table ferry.subscriptions add column managed_by text;

comment on column ferry.subscriptions.managed_by is
    'Set by `pgferry apply` (''apply''): such subscriptions are removed when they leave the file. NULL: made by hand.';

-- The envelope logic mirrors ferry.batch_events (0003): keep the two in step.
create function ferry.lookup_event(event_id bigint)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language sql stable as $$
    select e.id, e.txid, e.stream, e.key,
           case when e.op is null then e.payload
                else jsonb_build_object(
                    'type', case e.op when 'I' then 'INSERT' when 'U' then 'UPDATE' else 'DELETE' end,
                    'schema', c.schema_name,
                    'table', c.table_name,
                    'record', case when e.op = 'D' then null else e.payload end,
                    'old_record', case e.op when 'U' then e.old_payload when 'D' then e.payload end)
           end,
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

-- One chunk of a replay: the next max_rows replayable events with an id above
-- after_id are parked for immediate delivery (attempts 0, next_attempt_at
-- now), where the subscription's retry loop picks them up. Events already
-- parked or dead-lettered for the subscription are skipped (dead letters come
-- back with `pgferry dlq replay`). Returns how many were queued and skipped,
-- and the last id looked at (NULL when nothing was left): pass it as after_id
-- for the next chunk.
create function ferry.replay(
    subscription text, since timestamptz default null, from_event bigint default null,
    after_id bigint default 0, max_rows integer default 1000)
returns table (queued bigint, skipped bigint, last_id bigint)
language plpgsql as $$
declare
    v_sub text := replay.subscription;
begin
    if max_rows < 1 then
        raise exception 'pgferry: max_rows must be at least 1, got %', max_rows using errcode = '22023';
    end if;
    return query
    with picked as (
        select e.* from ferry._replayable(v_sub, since, from_event) e
        where e.id > coalesce(after_id, 0)
        order by e.id
        limit max_rows
    ), queued as (
        insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                                   attempts, first_failed_at, next_attempt_at, last_error)
        select v_sub, p.id, p.stream, p.key, p.payload, p.headers, p.created_at, 0, now(), now(), 'replayed by an operator'
        from picked p
        where not exists (select 1 from ferry.dead_letters d where d.subscription = v_sub and d.event_id = p.id)
        on conflict do nothing
        returning 1
    )
    select (select count(*) from queued), (select count(*) from picked) - (select count(*) from queued),
           (select max(p.id) from picked p);
end $$;

-- Recent failures (dashboard, `pgferry status`) without walking past every
-- success: only failed attempts are indexed, so the index stays small.
create index attempts_failed_idx on ferry.attempts (id) where error_class is not null;
