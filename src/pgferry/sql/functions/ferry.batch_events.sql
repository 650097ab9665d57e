-- ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null, reader text default null) returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
--
-- The events of the batch (start_tick, end_tick]: committed after start_tick
-- and no later than end_tick, optionally only those of streams, in id order,
-- captured rows in their Supabase envelope (ferry._envelope), without the
-- backfill events targeted at another consumer than reader (NULL: keeps only
-- events for everyone; migration 0013). Scans the txid
-- range from start_tick's xmax (not its xmin, so one long transaction cannot
-- make every read slow) plus the transactions start_tick listed as in
-- progress; both ranges are bounded on both sides so the txid index is the
-- plan even before a partition has statistics (migration 0007's essay).
--
-- Calls:   ferry._envelope
-- Reads:   ferry.captures, ferry.events, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null,
                                              reader text default null)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
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
    select p.id, p.txid, p.stream, p.key,
           ferry._envelope(p.op, p.payload, p.old_payload, c.schema_name, c.table_name),
           p.headers, p.created_at
    from picked p left join ferry.captures c on c.id = p.capture
    order by p.id
$$;
