-- ferry.retention_status() returns table (consumer text, subscription text, streams text[], tick_id bigint, lag_seconds double precision, held_bytes bigint, log_bytes bigint, max_retention interval, max_retention_bytes bigint, time_pct double precision, size_pct double precision, level text, stalled_at timestamptz, stalled_reason text, gaps bigint, gap_events bigint, last_gap_at timestamptz, wal_gaps bigint)
--
-- Per consumer, how close it is to the retention limit (migration 0014):
-- lag_seconds, the age of the oldest tick its cursor has not passed (0 when
-- it is at the newest); held_bytes, the size of the closed partitions it
-- keeps from being truncated (those closed rotation_interval ago or more:
-- younger ones are kept anyway, and every consumer that keeps up holds the
-- one that just closed until its next tick); log_bytes, the size of the whole log (every
-- partition, indexes included: pg_total_relation_size). time_pct is
-- lag_seconds against max_retention; size_pct the log's size against
-- max_retention_bytes, for a consumer that holds something back (0 without
-- a size cap or when it holds nothing). level: 'stalled', '80%', '50%' or
-- 'ok', from the larger of the two. gaps, gap_events, last_gap_at sum up
-- its rows in ferry.gaps; wal_gaps counts those of WAL capture: its lost
-- slots (migration 0025: changes that never reached the log, how many is
-- unknown) and the changes skipped with ferry.skip_wal_change (migration
-- 0037), the rows that moved no cursor (migration 0027); gap_events sums
-- the events of the others only (a skipped change is counted once, as a
-- WAL gap). subscription: the subscription a webhook:NAME
-- consumer belongs to. `pgferry status`, the metrics, the dashboard and
-- ferry.maintain read it.
--
-- Calls:   -
-- Reads:   ferry.config, ferry.consumers, ferry.gaps, ferry.partitions, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.retention_status()
returns table (consumer text, subscription text, streams text[], tick_id bigint, lag_seconds double precision,
               held_bytes bigint, log_bytes bigint, max_retention interval, max_retention_bytes bigint,
               time_pct double precision, size_pct double precision, level text,
               stalled_at timestamptz, stalled_reason text, gaps bigint, gap_events bigint, last_gap_at timestamptz,
               wal_gaps bigint)
language sql stable as $$
    with cfg as (select f.max_retention, f.max_retention_bytes, f.rotation_interval from ferry.config f),
    parts as (
        select p.part, p.state, p.closed_xmax, p.closed_at,
               pg_total_relation_size(format('ferry.events_%s', p.part)::regclass) as bytes
        from ferry.partitions p),
    total as (select sum(pa.bytes)::bigint as log_bytes from parts pa),
    per as (
        select c.name, c.subscription, c.streams, c.tick_id, c.stalled_at, c.stalled_reason,
               coalesce(extract(epoch from now() - (select t2.created_at from ferry.ticks t2
                                                    where t2.id > c.tick_id order by t2.id limit 1)), 0)::float8
                   as lag_seconds,
               coalesce((select sum(pa.bytes) from parts pa
                         where pa.state = 'closed' and pg_snapshot_xmin(t.snapshot) < pa.closed_xmax
                           and pa.closed_at <= now() - cfg.rotation_interval
                           -- not one this very transaction closed (ferry.maintain's call): every consumer
                           -- holds it until its next tick, and each was warned of it (outside probe)
                           and pa.closed_xmax is distinct from pg_current_xact_id_if_assigned()), 0)::bigint
                   as held_bytes
        from cfg, ferry.consumers c left join ferry.ticks t on t.id = c.tick_id),
    pct as (
        select per.*, total.log_bytes, cfg.max_retention, cfg.max_retention_bytes,
               100 * per.lag_seconds / extract(epoch from cfg.max_retention)::float8 as time_pct,
               case when cfg.max_retention_bytes is null or per.held_bytes = 0 then 0::float8
                    else 100.0 * total.log_bytes / cfg.max_retention_bytes end as size_pct
        from per, total, cfg)
    select pct.name, pct.subscription, pct.streams, pct.tick_id, greatest(pct.lag_seconds, 0), pct.held_bytes, pct.log_bytes,
           pct.max_retention, pct.max_retention_bytes, greatest(pct.time_pct, 0), pct.size_pct,
           case when pct.stalled_at is not null then 'stalled'
                when greatest(pct.time_pct, pct.size_pct) >= 80 then '80%'
                when greatest(pct.time_pct, pct.size_pct) >= 50 then '50%'
                else 'ok' end,
           pct.stalled_at, pct.stalled_reason, g.n, g.events, g.last_at, g.wal
    from pct
    left join lateral (select count(*) as n, coalesce(sum(gp.events) filter (where gp.moved_cursor), 0)::bigint as events,
                              max(gp.updated_at) as last_at,
                              count(*) filter (where not gp.moved_cursor) as wal
                       from ferry.gaps gp where gp.consumer = pct.name) g on true
    order by pct.name
$$;
