-- ferry._batch_rows(start_tick bigint, end_tick bigint, streams text[] default null, reader text default null) returns table (id bigint, txid xid8, stream text, key text, op "char", payload jsonb, old_payload jsonb, headers jsonb, created_at timestamptz, schema_name text, table_name text)
--
-- The rows of the batch (start_tick, end_tick] as stored, in id order, with
-- their capture's table: what ferry.batch_events is made of before the
-- envelope, for the relay's reads (ferry.webhook_steps), which render the
-- envelope as text (ferry._envelope_text) and build the jsonb one only for a
-- subscription's filter. Committed after start_tick and no later than
-- end_tick, optionally only those of streams, without the backfill events
-- targeted at another consumer than reader (NULL: keeps only events for
-- everyone; migration 0013). Scans the txid range from start_tick's xmax
-- (not its xmin, so one long transaction cannot make every read slow) plus
-- the transactions start_tick listed as in progress; both ranges are bounded
-- on both sides so the txid index is the plan even before a partition has
-- statistics (migration 0007's essay). SQL, so that it is inlined: a caller's
-- condition on id reaches the scans.
--
-- Calls:   -
-- Reads:   ferry.captures, ferry.events, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._batch_rows(start_tick bigint, end_tick bigint, streams text[] default null,
                                             reader text default null)
returns table (id bigint, txid xid8, stream text, key text, op "char", payload jsonb, old_payload jsonb,
               headers jsonb, created_at timestamptz, schema_name text, table_name text)
language sql stable as $$
    with a as (select snapshot from ferry.ticks where id = start_tick),
         b as (select snapshot from ferry.ticks where id = end_tick),
         picked as (
             select e.* from ferry.events e, a, b
             where e.txid >= pg_snapshot_xmax(a.snapshot) and e.txid < pg_snapshot_xmax(b.snapshot)
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams))
               and (e.target is null or e.target = reader)
             union all
             select e.* from ferry.events e, a, b
             where e.txid = any (array(select pg_snapshot_xip(a.snapshot)))
               and e.txid >= pg_snapshot_xmin(a.snapshot) and e.txid < pg_snapshot_xmax(a.snapshot)
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams))
               and (e.target is null or e.target = reader))
    select p.id, p.txid, p.stream, p.key, p.op, p.payload, p.old_payload, p.headers, p.created_at,
           c.schema_name, c.table_name
    from picked p left join ferry.captures c on c.id = p.capture
    order by p.id
$$;
