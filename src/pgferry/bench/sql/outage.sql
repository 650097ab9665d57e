-- Named queries of `pgferry bench outage`. Each starts with "-- name: NAME".

-- name: subscribe
-- Every retry and health setting at its default: the point is that defaults recover fast.
select ferry.subscribe('outage', array['outage'], $1)

-- name: publish
-- One round of the load: events seq $1 .. $1 + $2 - 1 of phase $3, in one transaction; returns their ids.
select array_agg(ferry.publish('outage', jsonb_build_object('seq', n, 'phase', $3::text)) order by n)
from generate_series($1::bigint, $1::bigint + $2::bigint - 1) as n

-- name: sample
-- Events parked (held while the endpoint is down, or waiting for a retry) and dead letters.
select (select count(*) from ferry.retries where subscription = 'outage') as parked,
       (select count(*) from ferry.dead_letters where subscription = 'outage') as dead

-- name: dead_ids
select event_id from ferry.dead_letters where subscription = 'outage'

-- name: attempts_by_class
-- Attempts the relay recorded between $1 and $2 (it stamps them when it records them) for the
-- events $3 (not the warm-up's, whose last attempts may be recorded after the outage began), by outcome.
select coalesce(error_class, 'ok ' || status::text) as outcome, count(*) as n
from ferry.attempt_history()
where subscription = 'outage' and created_at >= $1 and created_at < $2 and event_id = any($3::bigint[])
group by 1 order by 2 desc

-- name: attempts_per_event
-- The most attempts any outage event took (held events spend none), and events sent more than once.
select coalesce(max(n), 0) as most, count(*) filter (where n > 1) as retried
from (select count(*) as n from ferry.attempt_history() where subscription = 'outage' and event_id = any($1::bigint[])
      group by event_id) as per_event
