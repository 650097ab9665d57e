-- ferry.subscription_status() returns table (name text, state text, state_reason text, url text, streams text[], lag_events bigint, lag_seconds double precision, parked bigint, dead bigint, delivered_1m bigint, failed_5m bigint, attempts_5m bigint, owner text, in_flight integer, filter text)
--
-- Rates come from the owning relay's heartbeat (rolling in-memory counters),
-- so status stays cheap however many attempts are stored. filter is the
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
               filter text)
language sql stable as $$
    select s.name, s.state, s.state_reason,
           regexp_replace(s.url, '\?.*$', '?…'),
           s.streams,
           greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq),
           coalesce(extract(epoch from now() - (select min(t.created_at) from ferry.ticks t where t.id > c.tick_id)), 0),
           (select count(*) from ferry.retries r where r.subscription = s.name),
           (select count(*) from ferry.dead_letters d where d.subscription = s.name),
           (r.stats -> 'delivered_1m' ->> s.name)::bigint,
           (r.stats -> 'failed_5m' ->> s.name)::bigint,
           (r.stats -> 'attempts_5m' ->> s.name)::bigint,
           r.id,
           (r.stats -> 'in_flight' ->> s.name)::int,
           s.filter
    from ferry.subscriptions s
    left join ferry.consumers c on c.name = 'webhook:' || s.name
    left join ferry.ticks t0 on t0.id = c.tick_id
    left join lateral (
        select rl.id, rl.stats from ferry.relays rl
        where s.name = any (rl.owned) and rl.heartbeat_at > now() - interval '15 seconds'
        order by rl.heartbeat_at desc limit 1) r on true
    order by s.name
$$;
