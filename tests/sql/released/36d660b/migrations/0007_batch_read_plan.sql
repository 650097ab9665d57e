-- pgferry 0007: reading a batch must not scan the whole partition.
--
-- ferry.batch_events finds the events a tick range covers in two parts: the
-- txid range between the two ticks' xmax, and the transactions the start
-- tick listed as in progress (its xip). The second part was written as
-- `txid = any (xip)` alone. Until a partition has planner statistics
-- (autovacuum analyzes a fresh one within a minute or so, and never within
-- a short burst) PostgreSQL guesses that each xid matches 0.5% of the rows
-- and each xip holds 50 xids, so "a quarter of the table" makes a sequential
-- scan look cheaper than the index. Every read then scanned the whole
-- current partition: measured with auto_explain under `pgferry bench
-- webhooks`, reads cost 60 us per event instead of 5 and grew with the
-- partition, the relay fell behind the inserts, and the batch-100 scenario
-- ran between 23K and 64K events/s depending on when autovacuum happened to
-- analyze.
--
-- Every xid in a snapshot's xip lies in [xmin, xmax) of that snapshot, so
-- adding that range changes no result; it gives the planner a range
-- estimate that keeps the txid index the cheapest path with or without
-- statistics (tests/log/test_read_plan.py checks the plan on a partition
-- that was never analyzed).
create or replace function ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language sql stable as $$
    with a as (select snapshot from ferry.ticks where id = start_tick),
         b as (select snapshot from ferry.ticks where id = end_tick),
         picked as (
             select e.* from ferry.events e, a, b
             where e.txid >= pg_snapshot_xmax(a.snapshot) and e.txid < pg_snapshot_xmax(b.snapshot)
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams))
             union all
             select e.* from ferry.events e, a, b
             where e.txid = any (array(select pg_snapshot_xip(a.snapshot)))
               and e.txid >= pg_snapshot_xmin(a.snapshot) and e.txid < pg_snapshot_xmax(a.snapshot)
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams)))
    select p.id, p.txid, p.stream, p.key,
           ferry._envelope(p.op, p.payload, p.old_payload, c.schema_name, c.table_name),
           p.headers, p.created_at
    from picked p left join ferry.captures c on c.id = p.capture
    order by p.id
$$;
