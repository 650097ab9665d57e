-- ferry._record_expression(capture integer, row_expr text) returns text
--
-- The SQL expression that builds a capture's record (jsonb) from a row: the
-- one place that applies its column choice (ferry.captures.columns or
-- exclude_columns), used by ferry.capture_table for record and old_record,
-- and by backfills, whose READ events must carry the same record a
-- captured change would.
-- capture: ferry.captures.id; row_expr: the row, an alias ('r') or a
-- composite expression ('od.o').
-- Returns: to_jsonb(<row>) when the capture keeps every column;
-- jsonb_build_object('a', <row>.a, ...) for columns, in their given order
-- (in pieces of 50 pairs joined by ||, since a function takes at most 100
-- arguments); (to_jsonb(<row>) - '{...}') for exclude_columns. An alias
-- that is also a column's name is written r.*: a bare r names the column
-- (backfills and WAL capture of a table with a column r recorded that
-- column's value as the whole record). Otherwise bare, so that triggers
-- without options keep the text of 0010. Column names are quoted, so the result is safe to
-- splice into a statement. Example, the rows of a backfill of capture c
-- (the condition is deparsed, with unqualified column names: read the
-- table alone, so they can name nothing else):
--   execute format('select %s as key, %s as record from only %s r where %s',
--                  ferry._key_expression(c.id, 'r'), ferry._record_expression(c.id, 'r'),
--                  c.relid::regclass, coalesce(c.condition, 'true'));
--
-- Calls:   -
-- Reads:   ferry.captures, pg_attribute
-- Writes:  -
-- Raises:  22023 (no such capture)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._record_expression(capture integer, row_expr text) returns text
language plpgsql stable as $$
declare
    v_columns text[];
    v_exclude text[];
    v_whole   text;
    v_field   text;
    v_parts   text;
begin
    select c.columns, c.exclude_columns into v_columns, v_exclude from ferry.captures c where c.id = capture;
    if not found then
        raise exception 'pgferry: no capture %', capture using errcode = '22023';
    end if;
    v_whole := case when row_expr ~ '^[a-z_][a-z0-9_]*$'
                         and exists (select 1 from ferry.captures c join pg_attribute a on a.attrelid = c.relid
                                     where c.id = capture and a.attname = row_expr and a.attnum > 0
                                       and not a.attisdropped)
                    then row_expr || '.*' else row_expr end;
    if v_exclude is not null then
        return format('(to_jsonb(%s) - %L::text[])', v_whole, v_exclude);
    end if;
    if v_columns is null then
        return format('to_jsonb(%s)', v_whole);
    end if;
    -- r.a for an alias, (od.o).a for a composite expression.
    v_field := case when row_expr ~ '^[a-z_][a-z0-9_]*$' then row_expr || '.%I' else '(' || row_expr || ').%I' end;
    select string_agg(format('jsonb_build_object(%s)', pairs), ' || ' order by chunk) into v_parts
    from (select (i - 1) / 50 as chunk, string_agg(format('%L, ' || v_field, col, col), ', ' order by i) as pairs
          from unnest(v_columns) with ordinality x(col, i) group by 1) chunks;
    return case when v_columns[51] is null then v_parts else '(' || v_parts || ')' end;
end $$;
