-- ferry.lookup_event(event_id bigint) returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz, target text)
--
-- One event as readers see it (captured rows in their envelope), or no row
-- once retention dropped it. target: the consumer a backfill event is for
-- (NULL: every reader; migration 0013).
--
-- Calls:   ferry._envelope
-- Reads:   ferry.captures, ferry.events
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.lookup_event(event_id bigint)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz,
               target text)
language sql stable as $$
    select e.id, e.txid, e.stream, e.key,
           ferry._envelope(e.op, e.payload, e.old_payload, c.schema_name, c.table_name),
           e.headers, e.created_at, e.target
    from ferry.events e left join ferry.captures c on c.id = e.capture
    where e.id = lookup_event.event_id
$$;
