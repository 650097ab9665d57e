-- ferry._range_streams(start_tick bigint, end_tick bigint) returns text[]
--
-- The streams that have events committed between two ticks (the range a batch
-- from start_tick to end_tick would hold), each once; NULL when either tick is
-- no longer retained. The relay's LogWatch reads it once per new tick for all
-- the subscriptions it delivers, and wakes only those on these streams: the
-- others are moved over the range without reading it. Events targeted at one
-- reader (backfills) count for everyone, which at worst wakes a subscription
-- for nothing.
--
-- Calls:   -
-- Reads:   ferry.events, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._range_streams(start_tick bigint, end_tick bigint) returns text[]
language sql stable as $$
    with a as (select snapshot from ferry.ticks where id = start_tick),
         b as (select snapshot from ferry.ticks where id = end_tick)
    select case when exists (select from a) and exists (select from b) then
        coalesce((select array_agg(distinct x.stream) from (
            select e.stream from ferry.events e, a, b
            where e.txid >= pg_snapshot_xmax(a.snapshot) and e.txid < pg_snapshot_xmax(b.snapshot)
              and pg_visible_in_snapshot(e.txid, b.snapshot)
            union all
            select e.stream from ferry.events e, a, b
            where e.txid = any (array(select pg_snapshot_xip(a.snapshot)))
              and e.txid >= pg_snapshot_xmin(a.snapshot) and e.txid < pg_snapshot_xmax(a.snapshot)
              and pg_visible_in_snapshot(e.txid, b.snapshot)) x), '{}')
    end
$$;
