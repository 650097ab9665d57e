-- ferry._backfill_condition(tbl regclass, condition text) returns text
--
-- Checks a backfill's condition and returns it as PostgreSQL spells it:
-- one boolean expression over the rows of tbl, deparsed (comments gone,
-- names outside pg_catalog schema-qualified, so it means the same under
-- any search_path), in the form ferry.backfill_chunk runs it (the table
-- aliased r). It may use subqueries, unlike a capture's condition. It was
-- checked as `select 1 from tbl where (<text>)` and run as `... and
-- (<text>)` in another statement: `orders.id > 3` passed and failed on the
-- first chunk (the alias), and `id > 0) --` passed and commented out the
-- rest of the chunk's statement (outside probe). Now the text is parsed
-- once, in a view, and what runs is the view's deparsed WHERE, accepted
-- only if it parses back to the same view (nothing but one expression).
-- NULL for NULL.
--
-- Calls:   ferry._set_portable_output
-- Reads:   tbl (the plan only, in a view rolled back), and whatever the condition names
-- Writes:  - (a temporary view, rolled back)
-- Raises:  22023 (empty), 42601 (more than one expression), and the SQLSTATE of an invalid condition (42703, 42804, ...)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._backfill_condition(tbl regclass, condition text) returns text
language plpgsql as $$
declare
    v_view    text := format('pgferry_backfill_condition_%s', pg_backend_pid());
    v_hint    text := 'Write it as the WHERE clause of a query on the table would be (the table is aliased r), '
                      'e.g. status = ''paid'' or customer_id in (select id from customers where active).';
    v_def     text;
    v_expr    text;
    v_again   text;
    v_state   text;
    v_message text;
begin
    if condition is null then
        return null;
    end if;
    if btrim(condition) = '' then
        raise exception 'pgferry: condition is empty' using errcode = '22023',
            hint = 'Pass a boolean expression, or leave condition out (NULL) to backfill every row.';
    end if;
    begin
        -- The newline ends a trailing -- comment before the closing parenthesis.
        execute format(E'create temporary view %I as select 1 as pgferry_one from %s r where (%s\n)',
                       v_view, tbl, condition);
        -- And on its own, without the parentheses around it: `id > 1) or (true` parsed inside
        -- them, as `(id > 1) or true`, and the backfill took every row (outside probe).
        begin
            execute format(E'create temporary view %I as select 1 as pgferry_one from %s r where %s\n',
                           v_view || '_bare', tbl, condition);
        exception when syntax_error then
            raise exception 'its parentheses do not balance (it does not parse on its own)' using errcode = '42601';
        end;
        -- Names schema-qualified, constants in forms every session reads back (DateStyle ISO...):
        -- the condition runs again in whichever session resumes the backfill. (Back with the rollback below.)
        perform ferry._set_portable_output();
        perform set_config('search_path', 'pg_catalog', true);
        v_def := pg_get_viewdef(format('pg_temp.%I', v_view)::regclass);
        v_expr := substring(v_def from E'\n  WHERE (.*);$');
        if v_expr is not null then
            execute format('create temporary view %I as select 1 as pgferry_one from %s r where (%s)',
                           v_view || '_again', tbl, v_expr);
            v_again := pg_get_viewdef(format('pg_temp.%I', v_view || '_again')::regclass);
        end if;
        if v_again is distinct from v_def then
            v_state := '42601';
            v_message := 'it is more than one boolean expression';
        end if;
        raise exception using errcode = 'PF0CK';  -- roll the views and the search_path back
    exception
        when sqlstate 'PF0CK' then
            null;
        when others then
            get stacked diagnostics v_state = returned_sqlstate, v_message = message_text;
    end;
    if v_state is not null then
        raise exception 'pgferry: condition % is not a valid boolean expression over the rows of %: %',
            quote_literal(condition), tbl, v_message
            using errcode = v_state, hint = v_hint;
    end if;
    return v_expr;
end $$;
