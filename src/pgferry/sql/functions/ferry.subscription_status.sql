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
    select s.name, s.state, s.state_reason,
           case when s.url ~* '^(nats|redis):' then s.url else regexp_replace(s.url, '\?.*$', '?…') end,  -- shown_url's rule
           s.streams,
           greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq),
           coalesce(extract(epoch from now() - (select min(t.created_at) from ferry.ticks t where t.id > c.tick_id)), 0),
           (select count(*) from ferry.retries r where r.subscription = s.name),
           (select count(*) from ferry.dead_letters d where d.subscription = s.name),
           r.delivered_1m, r.failed_5m, r.attempts_5m, r.owner, r.in_flight::int,
           s.filter, s.partitions, c.draining::int
    from ferry.subscriptions s
    left join lateral (
        select min(c.tick_id) as tick_id, count(*) filter (where c.drain_to is not null) as draining
        from ferry.consumers c where c.subscription = s.name) c on true
    left join ferry.ticks t0 on t0.id = c.tick_id
    left join lateral (
        select string_agg(rl.id, ', ' order by rl.id) as owner,
               sum((rl.stats -> 'delivered_1m' ->> s.name)::bigint)::bigint as delivered_1m,
               sum((rl.stats -> 'failed_5m' ->> s.name)::bigint)::bigint as failed_5m,
               sum((rl.stats -> 'attempts_5m' ->> s.name)::bigint)::bigint as attempts_5m,
               sum((rl.stats -> 'in_flight' ->> s.name)::bigint) as in_flight
        from ferry.relays rl
        where rl.heartbeat_at > now() - interval '15 seconds'
          and exists (select 1 from unnest(rl.owned) o where split_part(o, '#', 1) = s.name)) r on true
    order by s.name
$$;
