-- ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null, reader text default null) returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
--
-- The events of the batch (start_tick, end_tick]: committed after start_tick
-- and no later than end_tick, optionally only those of streams, in id order,
-- captured rows in their Supabase envelope (ferry._envelope), without the
-- backfill events targeted at another consumer than reader (NULL: keeps only
-- events for everyone; migration 0013). Which rows, and how they are found:
-- ferry._batch_rows.
--
-- Calls:   ferry._batch_rows, ferry._envelope
-- Reads:   ferry.captures, ferry.events, ferry.ticks
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null,
                                              reader text default null)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language sql stable as $$
    select r.id, r.txid, r.stream, r.key,
           ferry._envelope(r.op, r.payload, r.old_payload, r.schema_name, r.table_name),
           r.headers, r.created_at
    from ferry._batch_rows(start_tick, end_tick, streams, reader) r
    order by r.id
$$;
