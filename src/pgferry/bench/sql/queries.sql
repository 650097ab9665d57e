-- Named queries of `pgferry bench capture`. Each starts with "-- name: NAME".

-- name: drop_database
drop database if exists pgferry_bench with (force)

-- name: create_database
create database pgferry_bench

-- name: server_info
select current_setting('server_version') as version,
       current_setting('fsync') as fsync,
       current_setting('synchronous_commit') as synchronous_commit,
       current_setting('wal_sync_method') as wal_sync_method,
       current_setting('full_page_writes') as full_page_writes,
       current_setting('shared_buffers') as shared_buffers,
       current_setting('max_wal_size') as max_wal_size

-- name: checkpoint
checkpoint

-- name: truncate_inserts
truncate bench_plain, bench_capture, bench_filtered, bench_outbox, bench_outbox_events, bench_notify, ferry.events

-- name: truncate_e2e
truncate bench_e2e, ferry.events

-- name: truncate_events
truncate ferry.events

-- name: vacuum_analyze
vacuum analyze

-- name: count_e2e
select count(*) from bench_e2e

-- name: last_tick_id
select last_value from ferry.tick_id_seq

-- name: advisory_lock_held
-- Whether some session of the bench database holds the advisory lock (classid, objid).
select exists (
    select 1 from pg_locks l join pg_database d on d.oid = l.database
    where l.locktype = 'advisory' and l.granted and d.datname = current_database()
      and l.classid = $1::int::oid and l.objid = $2::int::oid and l.objsubid = 2
)

-- name: active_consumers
-- The consumers a relay delivers: one per active subscription, or per partition of one.
select c.name from ferry.consumers c join ferry.subscriptions s on s.name = c.subscription where s.state = 'active'

-- name: active_consumers_undelivered
-- The consumers a relay delivers (active_consumers) whose advisory lock (class $1) no session holds yet.
select c.name from ferry.consumers c join ferry.subscriptions s on s.name = c.subscription
where s.state = 'active' and not exists (
    select 1 from pg_locks l join pg_database d on d.oid = l.database
    where l.locktype = 'advisory' and l.granted and d.datname = current_database()
      and l.classid = $1::int::oid and l.objid = hashtext(c.name)::oid and l.objsubid = 2)

-- name: relays_delivering
-- Live relays (relay processes) that deliver something.
select count(*) from ferry.relays where heartbeat_at > now() - interval '5 seconds' and cardinality(owned) > 0

-- name: database_xacts
-- Transactions (queries, for autocommit clients) the database has run so far.
select xact_commit + xact_rollback from pg_stat_database where datname = $1

-- name: count_events
select count(*) from ferry.events

-- name: has_pg_stat_statements
select to_regclass('pg_stat_statements') is not null
    and current_setting('shared_preload_libraries') ~ 'pg_stat_statements'

-- name: create_pg_stat_statements
create extension if not exists pg_stat_statements

-- name: statement_calls
-- Calls per statement in database $1 so far (pg_stat_statements, when loaded).
select s.query, sum(s.calls)::bigint as calls
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = $1
group by s.query

-- name: idle_subscribe
-- $1 webhook subscriptions on a stream nothing writes (the discard port: never sent to).
select count(*) from (
    select ferry.subscribe('bench-idle-' || n, array['bench-idle'], 'http://127.0.0.1:9/idle')
    from generate_series(1, $1) n) s

-- name: idle_unsubscribe
select count(ferry.unsubscribe(name)) from ferry.subscriptions where name like 'bench-idle-%'
