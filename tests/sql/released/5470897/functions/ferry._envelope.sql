-- ferry._envelope(op "char", payload jsonb, old_payload jsonb, schema_name text, table_name text) returns jsonb
--
-- The payload readers see: a captured row (op set) in its Supabase envelope,
-- a published event as stored. op 'R' is a backfilled row (type READ,
-- old_record null, migration 0013); op 'T' a TRUNCATE captured from the WAL
-- (type TRUNCATE, record and old_record null, migration 0020). STABLE like jsonb_build_object, so that it is
-- inlined into the queries that call it (an IMMUTABLE one would not be).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._envelope(op "char", payload jsonb, old_payload jsonb, schema_name text, table_name text)
returns jsonb language sql stable as $$
    select case when op is null then payload
                else jsonb_build_object(
                    'type', case op when 'I' then 'INSERT' when 'U' then 'UPDATE' when 'R' then 'READ'
                                    when 'T' then 'TRUNCATE' else 'DELETE' end,
                    'schema', schema_name,
                    'table', table_name,
                    'record', case when op in ('D', 'T') then null else payload end,
                    'old_record', case op when 'U' then old_payload when 'D' then payload end)
           end
$$;
