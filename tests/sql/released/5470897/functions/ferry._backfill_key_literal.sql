-- ferry._backfill_key_literal(key jsonb, columns text[], types text[]) returns text
--
-- A primary key stored as a JSON object {column: value} written back as a
-- row of typed SQL literals ('41'::integer, 'x'::text), for the keyset
-- (values in their text form, as ferry.backfill_chunk stores them; the
-- numbers and strings earlier versions stored as JSON read the same)
-- predicate of a backfill chunk: literals, not a lookup, so that the
-- planner sees constants and walks the primary-key index from there.
-- key: the stored key; columns, types: the primary key's columns and their
-- types (format_type), in index order. Returns the list, comma-separated.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._backfill_key_literal(key jsonb, columns text[], types text[])
returns text language sql immutable as $$
    select string_agg(format('%L::%s', key ->> c, t), ', ' order by o)
    from unnest(columns, types) with ordinality as x(c, t, o)
$$;
