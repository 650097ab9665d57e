-- ferry.attempt_history() returns table (id bigint, subscription text, event_id bigint, attempt integer, status integer, error_class text, error text, response text, latency_ms real, created_at timestamptz)
--
-- Every recorded attempt, one row per event and attempt, as ferry.attempts
-- held them before migration 0029: the rows of ferry.attempts (failures, and
-- successes recorded beside them) and the events of each ferry.deliveries
-- row (successes, one row per acknowledgement). For reports and checks over
-- the history; pgferry trace looks one event up through the tables' indexes
-- instead (queries.sql, trace_attempts). Ids share one sequence: ordered by
-- id, an event's attempts come in the order they were recorded.
--
-- Calls:   -
-- Reads:   ferry.attempts, ferry.deliveries
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.attempt_history()
returns table (id bigint, subscription text, event_id bigint, attempt integer, status integer, error_class text,
               error text, response text, latency_ms real, created_at timestamptz)
language sql stable as $$
    select a.id, a.subscription, a.event_id, a.attempt, a.status, a.error_class, a.error, a.response, a.latency_ms,
           a.created_at
    from ferry.attempts a
    union all
    select d.id, d.subscription, e.event_id, d.attempt, d.status, null, null, null, e.latency_ms, d.created_at
    from ferry.deliveries d
    cross join lateral unnest(d.event_ids, d.latencies_ms) as e(event_id, latency_ms)
$$;
