-- ferry.relay_round(relay_id text, hostname text, pid integer, owned text[], stats jsonb) returns table (live_relays bigint, consumer text, part integer, parts integer, draining boolean, drained boolean, waiting boolean, subscription ferry.subscriptions)
--
-- One relay round trip: heartbeat (owned NULL: the same units as the last
-- round's, whose list is then not written again: 4,800 units rewritten every
-- 2 s were most of an idle relay's WAL), then what there is to deliver, with the
-- number of live relays (to compute a fair share): one row per consumer of
-- an active subscription, the unit a relay claims (a subscription of N
-- partitions has N, migration 0018). During a change of partitions the
-- old ones are `draining` (they read up to their drain_to tick) until
-- `drained` (their owner stops them and removes them, after their retries
-- in flight are recorded), and the new ones are `waiting`: they read
-- nothing before the old ones are drained, nor retry parked events while
-- any old one remains (the old ones retry them meanwhile). A relay is live while its
-- ownership connection holds the shared "presence" advisory lock (classid
-- 0x7066, objid 3), so a killed relay stops counting the moment its
-- connection ends, however rarely relays heartbeat.
--
-- Calls:   -
-- Reads:   ferry.consumers, ferry.subscriptions
-- Writes:  ferry.relays
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.relay_round(relay_id text, hostname text, pid integer, owned text[], stats jsonb)
returns table (live_relays bigint, consumer text, part integer, parts integer, draining boolean, drained boolean,
               waiting boolean, subscription ferry.subscriptions)
language plpgsql as $$
declare
    v_live bigint;
begin
    insert into ferry.relays as r (id, hostname, pid, owned, stats)
    values (relay_round.relay_id, relay_round.hostname, relay_round.pid, coalesce(relay_round.owned, '{}'),
            relay_round.stats)
    on conflict (id) do update set heartbeat_at = now(), owned = coalesce(relay_round.owned, r.owned),
                                   stats = excluded.stats;
    select count(*) into v_live from pg_locks l
    where l.locktype = 'advisory' and l.classid = 28774 and l.objid = 3 and l.objsubid = 2
      and l.granted and l.database = (select oid from pg_database where datname = current_database());
    return query
        select v_live, c.name, c.part, c.parts, c.drain_to is not null, c.tick_id >= coalesce(c.drain_to, c.tick_id + 1),
               c.drain_to is null and exists (select 1 from ferry.consumers o
                                              where o.subscription = s.name and o.drain_to is not null),
               s
        from ferry.subscriptions s
        join ferry.consumers c on c.subscription = s.name
        where s.state = 'active'
        order by s.name, c.drain_to nulls last, c.part;
end $$;
