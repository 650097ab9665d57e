-- ferry._capture_condition(tbl regclass, condition text) returns text
--
-- Checks a capture condition and returns it as PostgreSQL spells it
-- (deparsed: comments gone, types and casts explicit, names outside
-- pg_catalog schema-qualified, so it means the same under any writer's
-- search_path), the form
-- ferry.capture_table writes into the generated trigger functions and stores
-- in ferry.captures. The condition must be one boolean expression over the
-- table's columns by name; it may call functions, but not use subqueries,
-- aggregates, window or set-returning functions or other tables (it is
-- evaluated per statement on the changed rows, and a backfill must reach
-- the same answer later from the row alone).
-- How: in a subtransaction that is always rolled back, it adds the condition
-- as a CHECK constraint to an empty copy of the table's columns and reads
-- the constraint back, so PostgreSQL's own parser and analyser decide: a
-- syntax error, an unknown column, a type mismatch or a non-boolean result
-- fails here, when capture_table is called, never on a writer's first row.
-- Then it is evaluated on one row the table holds, if any (and the caller
-- may read it): what fails only on a value, such as an invalid regular
-- expression or a cast of text, fails here too (for a value some row holds,
-- not for every value a writer may bring).
-- A ';' is refused before anything runs, so the text cannot carry a second
-- statement; the deparsed result cannot either.
-- tbl: the table; condition: the expression (NULL: none, returns NULL).
-- Returns the deparsed expression.
--
-- Calls:   ferry._set_portable_output
-- Reads:   one row of tbl
-- Writes:  - (a scratch table ferry._capture_condition_<pid>, always rolled back)
-- Raises:  22023 (empty), 42601 (';', syntax), and what PostgreSQL raises for
--          the expression: 42703 (unknown column), 42804 (not boolean),
--          42883 (no such operator or function), 0A000 (subquery), ...
-- Runs as: the caller (SECURITY INVOKER; needs CREATE on schema ferry, as
--          capture_table does for its generated functions)
-- Callers: PUBLIC (the default)

create or replace function ferry._capture_condition(tbl regclass, condition text) returns text
language plpgsql as $$
declare
    v_scratch text := format('ferry._capture_condition_%s', pg_backend_pid());
    v_hint    text := 'Write one boolean expression over the table''s columns by name, e.g. condition => '
                      '''status = ''''paid''''''; it may call functions but not read other tables.';
    v_def     text;
    v_state   text;
    v_message text;
begin
    if condition is null then
        return null;
    end if;
    if btrim(condition) = '' then
        raise exception 'pgferry: condition is empty' using errcode = '22023',
            hint = 'Pass a boolean expression, or leave condition out (NULL) to capture every row.';
    end if;
    if strpos(condition, ';') > 0 then
        raise exception 'pgferry: condition % holds a '';'': it must be one boolean expression, not statements',
            quote_literal(condition)
            using errcode = '42601', hint = v_hint || ' Inside a string literal, write chr(59) for a '';''.';
    end if;
    begin
        execute format('create table %s (like %s)', v_scratch, tbl);
        begin
            -- The newline ends a trailing -- comment before the closing parenthesis.
            execute format(E'alter table %s add constraint pgferry_condition check (%s\n)', v_scratch, condition);
        exception when others then
            get stacked diagnostics v_state = returned_sqlstate, v_message = message_text;
        end;
        if v_state is null then
            -- Only the one constraint, and the columns untouched: the text stayed inside check (...).
            if (select count(*) from pg_constraint where conrelid = v_scratch::regclass and contype = 'c') = 1
               and (select count(*) from pg_attribute where attrelid = v_scratch::regclass and attnum > 0)
                   = (select count(*) from pg_attribute where attrelid = tbl and attnum > 0 and not attisdropped) then
                -- Deparsed with only pg_catalog on the search_path, so every other name comes
                -- out schema-qualified: the trigger runs under each writer's search_path. And
                -- with constants written the way every session reads them back: under DateStyle
                -- 'SQL, DMY' '2026-01-05'::date came out '05/01/2026' (May 1 to the writers) and
                -- a timestamptz with a zone abbreviation PostgreSQL reads as another zone.
                -- (The settings go back with the rollback below.)
                perform ferry._set_portable_output();
                perform set_config('search_path', 'pg_catalog', true);
                select pg_get_constraintdef(oid) into v_def from pg_constraint
                where conrelid = v_scratch::regclass and conname = 'pgferry_condition';
                -- tableoid is the one system column a CHECK may name; captured rows (transition
                -- tables, decoded WAL) have none, so every writer's statement would fail.
                if exists (select 1 from pg_constraint c, unnest(c.conkey) k
                           where c.conrelid = v_scratch::regclass and c.conname = 'pgferry_condition' and k < 0) then
                    v_state := '42703';
                    v_message := 'it names a system column (tableoid), which captured rows do not have';
                end if;
            else
                v_state := '42601';
                v_message := 'it is more than one expression';
            end if;
        end if;
        if v_state is null and has_table_privilege(tbl, 'SELECT') then
            -- Evaluated on one existing row: what fails only on a value (an invalid regular
            -- expression, a cast of text) passed the check above, then failed every write
            -- (outside probe). False for that row is fine.
            begin
                execute format('insert into %s select * from %s limit 1', v_scratch, tbl);
            exception when check_violation then
                null;
            when others then
                get stacked diagnostics v_state = returned_sqlstate, v_message = message_text;
                v_message := 'on a row the table holds: ' || v_message;
            end;
        end if;
        raise exception using errcode = 'PF0CK';  -- roll the scratch table back
    exception when sqlstate 'PF0CK' then
        null;
    end;
    if v_state is not null then
        raise exception 'pgferry: condition % is not a valid row condition for %: %',
            quote_literal(condition), tbl, replace(replace(v_message, 'CHECK constraint', 'condition'), 'check constraint', 'condition')
            using errcode = v_state, hint = v_hint;
    end if;
    -- 'CHECK (<expression>)'
    return substr(v_def, 8, length(v_def) - 8);
end $$;
