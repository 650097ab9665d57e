-- ferry.subscription_status() returns table (name text, state text, state_reason text, url text, streams text[], lag_events bigint, lag_seconds double precision, parked bigint, dead bigint, delivered_1m bigint, failed_5m bigint, attempts_5m bigint, owner text, in_flight integer, filter text, partitions integer, draining integer)
--
-- Rates come from the owning relays' heartbeats (rolling in-memory counters),
-- so status stays cheap however many attempts are stored. A subscription of
-- several partitions (migration 0018) lags as much as its slowest one; its
-- rates are summed over the relays delivering its partitions, owner lists
-- them, and draining counts the partitions of a change still draining. filter is the
-- subscription's filter as written (NULL: every event; migration 0012).
--
-- Calls:   -
-- Reads:   ferry.consumers, ferry.dead_letters, ferry.relays, ferry.retries, ferry.subscriptions, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.subscription_status()
returns table (name text, state text, state_reason text, url text, streams text[],
               lag_events bigint, lag_seconds double precision, parked bigint, dead bigint,
               delivered_1m bigint, failed_5m bigint, attempts_5m bigint, owner text, in_flight integer,
               filter text, partitions integer, draining integer)
language sql stable as $$
    -- The live relays' owned units and heartbeat counters, gathered once for every subscription:
    -- a lateral join per subscription unnested every relay's list each time (3,000 subscriptions,
    -- 4,800 units: 14 s a call, and the dashboard sampled it every 2 s; outside probe).
    with live as (
        select rl.id, rl.owned, rl.stats from ferry.relays rl where rl.heartbeat_at > now() - interval '15 seconds'
    ), owners as (
        select split_part(o.unit, '#', 1) as name, string_agg(distinct l.id, ', ' order by l.id) as owner
        from live l, unnest(l.owned) as o(unit)
        group by 1
    ), rates as (
        select v.key as name,
               sum(v.value::bigint) filter (where k.key = 'delivered_1m')::bigint as delivered_1m,
               sum(v.value::bigint) filter (where k.key = 'failed_5m')::bigint as failed_5m,
               sum(v.value::bigint) filter (where k.key = 'attempts_5m')::bigint as attempts_5m,
               sum(v.value::bigint) filter (where k.key = 'in_flight') as in_flight
        from live l, jsonb_each(l.stats) k, jsonb_each_text(k.value) v
        where k.key in ('delivered_1m', 'failed_5m', 'attempts_5m', 'in_flight') and jsonb_typeof(k.value) = 'object'
        group by 1  -- a relay counts only the subscriptions it delivers (Ownership._stats)
    )
    select s.name, s.state, s.state_reason,
           case when s.url ~* '^(nats|redis):' then s.url else regexp_replace(s.url, '\?.*$', '?…') end,  -- shown_url's rule
           s.streams,
           greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq),
           coalesce(extract(epoch from now() - (select min(t.created_at) from ferry.ticks t where t.id > c.tick_id)), 0),
           (select count(*) from ferry.retries r where r.subscription = s.name),
           (select count(*) from ferry.dead_letters d where d.subscription = s.name),
           -- counted by the relays delivering it, which leave zeros out (Ownership._stats)
           case when o.owner is not null then coalesce(r.delivered_1m, 0) end,
           case when o.owner is not null then coalesce(r.failed_5m, 0) end,
           case when o.owner is not null then coalesce(r.attempts_5m, 0) end, o.owner,
           case when o.owner is not null then coalesce(r.in_flight, 0)::int end,
           s.filter, s.partitions, c.draining::int
    from ferry.subscriptions s
    left join lateral (
        select min(c.tick_id) as tick_id, count(*) filter (where c.drain_to is not null) as draining
        from ferry.consumers c where c.subscription = s.name) c on true
    left join ferry.ticks t0 on t0.id = c.tick_id
    left join owners o on o.name = s.name
    left join rates r on r.name = s.name
    order by s.name
$$;
