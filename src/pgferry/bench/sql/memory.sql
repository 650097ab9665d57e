-- Named queries of `pgferry bench memory`. Each starts with "-- name: NAME".

-- name: create_table
-- Rows of one large JSON document each, captured as the issue's backlog was.
create table bench_large (id bigserial primary key, doc jsonb not null)

-- name: capture
select ferry.capture_table('bench_large', 'bench.large')

-- name: subscribe
select ferry.subscribe('memory', array['bench.large'], $1)

-- name: fill
-- $1 rows of about $2 bytes each, in one transaction (the caller commits and ticks per call).
-- The text differs per row so that PostgreSQL cannot share or skip anything.
insert into bench_large (doc)
select jsonb_build_object('n', g, 'body', repeat(md5(g::text || random()::text), $2 / 32))
from generate_series(1, $1) g

-- name: fill_random
-- The same, of text that does not compress (stored about as large as it is), as an outside probe's
-- backlog was: its bounded reads rendered the rest of a one-tick range each time.
insert into bench_large (doc)
select jsonb_build_object('n', g, 'body', (select string_agg(md5(random()::text || g || h), '')
                                            from generate_series(1, greatest(1, $2 / 32)) h))
from generate_series(1, $1) g

-- name: tick
select ferry.tick(true)

-- name: delivered
-- Events the subscription's cursor has passed (the relay's own count, to wait on).
select count(*) from ferry.attempt_history() where subscription = 'memory' and status between 200 and 299
