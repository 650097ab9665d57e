-- SQL of `pgferry bench backfill` (bench/backfill.py).

-- name: setup
-- The backfilled table: an orders-like row of ~100 bytes, filled with $1 rows, analysed (the
-- estimate comes from pg_class.reltuples), and captured.
create table bench_orders (
    id          bigint primary key,
    customer    integer not null,
    status      text not null,
    amount      numeric(12, 2) not null,
    note        text,
    updated_at  timestamptz not null default now()
);

-- name: fill
insert into bench_orders (id, customer, status, amount, note)
select g, g % 10007, (array['new', 'paid', 'shipped'])[1 + g % 3], (g % 100000) * 0.01, 'order ' || g
from generate_series(1, $1::bigint) g

-- name: capture
select ferry.capture_table('bench_orders')

-- name: analyze
analyze bench_orders

-- name: register
-- A consumer at the head of the log, so retention keeps what the cells write (nothing reads it).
select ferry.register_consumer('bench', null, 'now')

-- name: writes_between
-- Writer transactions that committed UPDATE events with created_at in [$1, $2): the writers' throughput
-- inside the backfill's window.
select count(*) from ferry.events where op = 'U' and created_at >= $1 and created_at < $2

-- name: read_events
-- READ events in the log (every backfill's rows, checked against what they say they did).
select count(*) from ferry.events where op = 'R'
