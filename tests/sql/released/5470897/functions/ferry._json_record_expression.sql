-- ferry._json_record_expression(capture integer, json_expr text) returns text
--
-- The twin of ferry._record_expression for a row that is already a jsonb
-- object (WAL capture's fast path, ferry._append_wal): the expression that
-- applies the capture's column choice to it.
-- capture: ferry.captures.id; json_expr: the object ('x.n', 'x.o').
-- Returns: json_expr itself when the capture keeps every column;
-- (<json> - '{...}') for exclude_columns; for columns, the object of those
-- keys (jsonb orders keys itself, so the record equals the one
-- ferry._record_expression builds). Column names are quoted, so the result
-- is safe to splice into a statement.
--
-- Calls:   -
-- Reads:   ferry.captures
-- Writes:  -
-- Raises:  22023 (no such capture)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._json_record_expression(capture integer, json_expr text) returns text
language plpgsql stable as $$
declare
    v_columns text[];
    v_exclude text[];
begin
    select c.columns, c.exclude_columns into v_columns, v_exclude from ferry.captures c where c.id = capture;
    if not found then
        raise exception 'pgferry: no capture %', capture using errcode = '22023';
    end if;
    if v_exclude is not null then
        return format('(%s - %L::text[])', json_expr, v_exclude);
    end if;
    if v_columns is not null then
        return format('(select jsonb_object_agg(j.key, j.value) from jsonb_each(%s) j where j.key = any(%L::text[]))',
                      json_expr, v_columns);
    end if;
    return json_expr;
end $$;
