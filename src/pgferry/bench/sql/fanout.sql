-- SQL of `pgferry bench fanout` (bench/fanout.py).

-- name: subscribe
-- One subscription per receiver port $1, on one shared stream ($2) or each on its own.
select count(*) from (
    select ferry.subscribe('fan-' || o, array[case when $2 then 'fan' else 'fan-' || o end],
                           'http://127.0.0.1:' || p || '/fan-' || o)
    from unnest($1::int[]) with ordinality as u(p, o)) s

-- name: subscribe_idle
-- $1 subscriptions on streams nothing writes (never sent to: the discard port).
select count(ferry.subscribe('idle-' || n, array['idle.' || n], 'http://127.0.0.1:9/idle'))
from generate_series(1, $1) n

-- name: publish
-- Event $1: one on the shared stream ($3), or one on each of the $2 subscriptions' streams.
select count(*) from ferry.publish_many(
    array(select case when $3 then 'fan' else 'fan-' || g end from generate_series(1, case when $3 then 1 else $2 end) g),
    array(select jsonb_build_object('n', $1::int, 't', extract(epoch from clock_timestamp()))
          from generate_series(1, case when $3 then 1 else $2 end)))

-- name: spread
-- Live relays delivering at least $1 subscriptions each: with several processes, the run starts
-- once the fair share has settled (the first to claim takes everything, then hands extras back).
select count(*) from ferry.relays
where heartbeat_at > now() - interval '15 seconds' and cardinality(owned) >= $1
