-- ferry._envelope_text(op "char", payload jsonb, old_payload jsonb, schema_name text, table_name text) returns text
--
-- ferry._envelope(...)::text, character for character, without building the
-- jsonb object first: the keys in the order jsonb prints them (by length,
-- then bytes: type, table, record, schema, old_record), its separators, its
-- string escapes (to_json), and each stored payload rendered once. What the
-- relay sends (ferry.webhook_steps): building the object and then printing it
-- cost about twice as much per event as printing the parts
-- (docs/benchmarks.md, "Profiling a relay that drains a backlog").
-- tests/sql/test_envelope_text.py holds it to ferry._envelope.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._envelope_text(op "char", payload jsonb, old_payload jsonb, schema_name text,
                                                table_name text)
returns text language sql stable as $$
    select case when op is null then payload::text
                else '{"type": "' || case op when 'I' then 'INSERT' when 'U' then 'UPDATE' when 'R' then 'READ'
                                             when 'T' then 'TRUNCATE' else 'DELETE' end
                     || '", "table": ' || coalesce(to_json(table_name)::text, 'null')
                     || ', "record": ' || coalesce(case when op in ('D', 'T') then null else payload end::text, 'null')
                     || ', "schema": ' || coalesce(to_json(schema_name)::text, 'null')
                     || ', "old_record": '
                     || coalesce(case op when 'U' then old_payload when 'D' then payload end::text, 'null') || '}'
           end
$$;
