-- Named queries used by the Python side. Each starts with "-- name: NAME";
-- the SQL API itself lives in the migrations as functions.

-- name: install_lock
select pg_advisory_xact_lock($1::int, $2::int)

-- name: create_migrations_table
create schema if not exists ferry;
create table if not exists ferry.schema_migrations (
    version    integer     primary key,
    name       text        not null,
    applied_at timestamptz not null default now()
);

-- name: applied_migrations
select version from ferry.schema_migrations

-- name: record_migration
insert into ferry.schema_migrations (version, name) values ($1, $2)

-- name: current_database
select current_database()

-- name: schema_installed
select to_regclass('ferry.schema_migrations') is not null

-- name: schema_version
select max(version) from ferry.schema_migrations

-- name: try_advisory_lock
select pg_try_advisory_lock($1::int, $2::int)

-- name: consumer_lock_key
select hashtext($1)

-- name: advisory_unlock
select pg_advisory_unlock($1::int, $2::int)

-- name: tick
select ferry.tick()

-- name: maintain
select ferry.maintain()

-- name: publish
select ferry.publish($1, $2::text::jsonb, $3, $4::text::jsonb)

-- name: publish_many
select ferry.publish_many($1, $2::text[]::jsonb[], $3, $4::text[]::jsonb[])

-- name: consumer_streams
select streams from ferry.consumers where name = $1

-- name: register_consumer
select ferry.register_consumer($1, $2, $3)

-- name: unregister_consumer
select ferry.unregister_consumer($1)

-- name: list_consumers
select c.name, c.streams, c.tick_id, c.next_tick_id, c.batch_id, c.updated_at,
       greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq) as approx_lag_events
from ferry.consumers c left join ferry.ticks t0 on t0.id = c.tick_id
order by c.name

-- name: next_batch
select batch_id, start_tick, end_tick, streams from ferry.next_batch($1, $2)

-- name: batch_events
select id, txid::text::bigint as txid, stream, key, payload, headers, created_at
from ferry.batch_events($1, $2, $3)

-- name: finish_batch
select ferry.finish_batch($1, $2)
