-- Named queries of `pgferry bench soak`. Each starts with "-- name: NAME".

-- name: configure
-- Rotate and prune often enough that a soak of minutes shows whether retention keeps the size flat.
update ferry.config set rotation_interval = $1::text::interval, attempts_retention = $2::text::interval

-- name: subscribe
select ferry.subscribe('soak', array['soak'], $1, timeout_ms => $2, max_attempts => $3,
                       retry_base_ms => 200, retry_max_ms => 5000, max_in_flight => 32)

-- name: publish
-- One round of the load: events seq $1 .. $2, each carrying its publish time for the latency.
select count(*) from (
    select ferry.publish('soak', jsonb_build_object('seq', n, 't', extract(epoch from clock_timestamp())))
    from generate_series($1::bigint, $2::bigint) as n) as published

-- name: sample
-- Database-side gauges: size, relay sessions, backlog, cursor age (lag), parked and dead events.
select pg_database_size(current_database()) as db_bytes,
       (select count(*) from pg_stat_activity
         where datname = current_database() and application_name like 'pgferry %') as relay_sessions,
       (select count(*) from ferry.retries) as parked,
       (select count(*) from ferry.dead_letters) as dead,
       (select count(*) from ferry.attempts) + (select count(*) from ferry.deliveries) as attempt_rows,
       (select extract(epoch from now() - t.created_at)
          from ferry.consumers c join ferry.ticks t on t.id = c.tick_id
         where c.name = 'webhook:soak') as cursor_age_s,
       (select count(*) from ferry.partitions where state <> 'empty') as partitions_in_use

-- name: dead_seqs
select (payload->>'seq')::bigint as seq from ferry.dead_letters where subscription = 'soak'
