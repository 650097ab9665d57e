-- ferry._check_columns(tbl regclass, names text[], what text) returns void
--
-- Refuses a list of column names given to ferry.capture_table that is empty
-- or names a column the table does not have (dropped columns and system
-- columns do not count), naming the parameter and every missing column.
-- tbl: the table; names: the list (NULL: not given, nothing to check);
-- what: the parameter's name, for the message.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023, 42703
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_columns(tbl regclass, names text[], what text) returns void
language plpgsql stable as $$
declare
    v_missing text;
begin
    if names is null then
        return;
    end if;
    if cardinality(names) = 0 or array_position(names, null) is not null then
        raise exception 'pgferry: % must name at least one column, and no NULL', what
            using errcode = '22023',
                  hint = format('Name columns of %s, e.g. %s => array[''id''], or leave %s out.', tbl, what, what);
    end if;
    -- A key named twice keyed every event by both copies ([2001, 2001]; outside probe).
    select string_agg(quote_ident(k), ', ') into v_missing
    from (select k from unnest(names) k group by k having count(*) > 1) d;
    if v_missing is not null then
        raise exception 'pgferry: % names % more than once', what, v_missing
            using errcode = '22023', hint = 'Name each column once.';
    end if;
    select string_agg(quote_ident(k), ', ') into v_missing from unnest(names) k
    where not exists (select 1 from pg_attribute a where a.attrelid = tbl and a.attname = k
                      and a.attnum > 0 and not a.attisdropped);
    if v_missing is not null then
        raise exception 'pgferry: table % has no column(s) % (in %)', tbl, v_missing, what
            using errcode = '42703',
                  hint = 'Column names are matched exactly, as stored (lower case unless created quoted).';
    end if;
end $$;
