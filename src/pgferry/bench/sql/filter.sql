-- Named queries of `pgferry bench filter`. Each starts with "-- name: NAME".

-- name: subscribe
-- One subscription per variant, all reading the same log from now on (nothing is ever sent:
-- the bench reads with ferry.webhook_steps and never runs a relay).
select ferry.subscribe($1, array['bench.capture'], 'http://127.0.0.1:9/never', filter => $2)

-- name: fill
-- $1 captured rows (account 0-99, amount 0-999, a short note), one statement.
insert into bench_capture (account, amount, note)
select g % 100, (g * 7919) % 1000, 'note ' || g from generate_series(1, $1) g

-- name: tick
select ferry.tick()

-- name: analyze
-- Statistics for the filled log, so every variant reads with the plan a settled relay gets.
analyze

-- name: log_events
-- How many events the walk reads from the log (every variant reads all of them).
select count(*) from ferry.events where stream = 'bench.capture'

-- name: read
-- The relay's read of a subscription's next batch after tick $2 (or its cursor), as webhook_steps
-- makes it for a worker, without opening or acknowledging anything.
select start_tick, end_tick, more, id
from ferry.webhook_steps(array[$1], array['webhook:' || $1], array[null::bigint], array[false], array[null::bigint],
                         array[null::bigint], array[true], array[$2::bigint], '{}', '{}', '{}', '{}', '{}', null)
