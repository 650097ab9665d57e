-- ferry._condition_outside_record_note(tbl regclass, condition text, columns text[], exclude_columns text[]) returns text
--
-- Raises a NOTICE (and returns its text, or NULL) when a capture's
-- condition reads columns its record leaves out (exclude_columns, or not
-- among columns). A row that leaves the condition gets one last UPDATE,
-- whose record cannot show that it left, and nothing after: a reader keeps
-- the row forever (outside probe: status = 'active' with status excluded).
-- A NOTICE, not a refusal: a condition over a column the readers must not
-- see (a flag, a tenant) is legitimate when rows never leave it, or when
-- readers are told otherwise. capture_table raises it; the API turns it
-- into a CaptureWarning and `pgferry capture` prints it.
-- The columns are those the deparsed condition names, found as PostgreSQL
-- does for a CHECK constraint on a scratch copy of the table, rolled back.
--
-- Calls:   -
-- Reads:   pg_constraint, pg_attribute
-- Writes:  - (a scratch table, rolled back)
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default); ferry.capture_table

create or replace function ferry._condition_outside_record_note(
    tbl regclass, condition text, columns text[], exclude_columns text[])
returns text language plpgsql as $$
declare
    v_scratch text := format('ferry._condition_note_%s', pg_backend_pid());
    v_names   text[];
    v_note    text;
begin
    if condition is null or (columns is null and exclude_columns is null) then
        return null;
    end if;
    begin
        execute format('create table %s (like %s)', v_scratch, tbl);
        execute format(E'alter table %s add constraint pgferry_condition check (%s\n)', v_scratch, condition);
        select array_agg(a.attname::text order by a.attnum) into v_names
        from pg_constraint c cross join lateral unnest(c.conkey) k(attnum)
        join pg_attribute a on a.attrelid = c.conrelid and a.attnum = k.attnum
        where c.conrelid = v_scratch::regclass and c.conname = 'pgferry_condition'
          and (a.attname = any (coalesce(exclude_columns, '{}'))
               or (columns is not null and a.attname <> all (columns)));
        raise exception using errcode = 'PF0CK';  -- roll the scratch table back
    exception when sqlstate 'PF0CK' then
        null;
    end;
    if v_names is null then
        return null;
    end if;
    v_note := format('the condition of %s reads %s, which its record leaves out: a row that leaves the condition '
                     'gets a last UPDATE whose record cannot show it left, and no event after (not its DELETE); '
                     'keep %s in the record if readers must see rows leave', tbl,
                     array_to_string(v_names, ', '), case when cardinality(v_names) = 1 then 'it' else 'them' end);
    raise notice 'pgferry: %', v_note;
    return v_note;
end $$;
