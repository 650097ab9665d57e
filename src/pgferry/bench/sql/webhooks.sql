-- Named queries of `pgferry bench webhooks`. Each starts with "-- name: NAME".

-- name: setup
create table if not exists spice_harvests (
    id           bigserial   primary key,
    harvester    text        not null,
    amount       integer     not null,
    harvested_at timestamptz not null default clock_timestamp()
);
select ferry.capture_table('spice_harvests');

-- name: reset
truncate spice_harvests;
delete from ferry.subscriptions;
delete from ferry.consumers;
truncate ferry.events, ferry.attempts, ferry.retries, ferry.dead_letters;

-- name: subscribe
select ferry.subscribe('bench', array['public.spice_harvests'], $1, batch_size => $2, max_in_flight => $3,
                       retry_base_ms => 100, retry_max_ms => 2000, max_attempts => 1000)

-- name: rows
select count(*) from spice_harvests

-- name: dead
select count(*) from ferry.dead_letters

-- name: failed_attempts
select count(*) from ferry.attempts where error_class is not null
