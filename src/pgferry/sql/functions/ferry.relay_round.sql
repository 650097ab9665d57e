-- ferry.relay_round(relay_id text, hostname text, pid integer, owned text[], stats jsonb) returns table (live_relays bigint, subscription ferry.subscriptions)
--
-- One relay round trip: heartbeat, then the active subscriptions with the
-- number of live relays (to compute a fair share). A relay is live while its
-- ownership connection holds the shared "presence" advisory lock (classid
-- 0x7066, objid 3), so a killed relay stops counting the moment its
-- connection ends, however rarely relays heartbeat.
--
-- Calls:   -
-- Reads:   ferry.subscriptions
-- Writes:  ferry.relays
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.relay_round(relay_id text, hostname text, pid integer, owned text[], stats jsonb)
returns table (live_relays bigint, subscription ferry.subscriptions)
language plpgsql as $$
begin
    insert into ferry.relays as r (id, hostname, pid, owned, stats)
    values (relay_round.relay_id, relay_round.hostname, relay_round.pid, relay_round.owned, relay_round.stats)
    on conflict (id) do update set heartbeat_at = now(), owned = excluded.owned, stats = excluded.stats;
    return query
        select (select count(*) from pg_locks l
                where l.locktype = 'advisory' and l.classid = 28774 and l.objid = 3 and l.objsubid = 2
                  and l.granted and l.database = (select oid from pg_database where datname = current_database())),
               s
        from ferry.subscriptions s where s.state = 'active' order by s.name;
end $$;
