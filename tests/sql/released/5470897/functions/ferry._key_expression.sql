-- ferry._key_expression(capture integer, row_expr text) returns text
--
-- The SQL expression that computes a capture's event key from a row: one
-- key column as text, several as a JSON array of their values. Used by
-- ferry.capture_table for every captured change and by backfills, whose
-- READ events must carry the key a captured change of the same row would.
-- The key is computed from the whole row, never from the record, so column
-- choice (columns, exclude_columns) cannot take it away.
-- capture: ferry.captures.id; row_expr: the row, an alias ('r') or a
-- composite expression ('od.o').
-- Returns e.g. (r.id)::text, or jsonb_build_array(r.order_id, r.line)::text.
--
-- Calls:   -
-- Reads:   ferry.captures
-- Writes:  -
-- Raises:  22023 (no such capture)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._key_expression(capture integer, row_expr text) returns text
language plpgsql stable as $$
declare
    v_keys  text[];
    v_field text;
begin
    select c.key_columns into v_keys from ferry.captures c where c.id = capture;
    if not found then
        raise exception 'pgferry: no capture %', capture using errcode = '22023';
    end if;
    -- r.a for an alias, (od.o).a for a composite expression.
    v_field := case when row_expr ~ '^[a-z_][a-z0-9_]*$' then row_expr || '.%I' else '(' || row_expr || ').%I' end;
    if cardinality(v_keys) = 1 then
        return format('(' || v_field || ')::text', v_keys[1]);
    end if;
    return format('jsonb_build_array(%s)::text',
                  (select string_agg(format(v_field, k), ', ' order by i) from unnest(v_keys) with ordinality x(k, i)));
end $$;
