-- ferry._refresh_trigger_captures() returns table (tbl text, error text)
--
-- Regenerates every trigger capture whose generated functions an earlier
-- ferry._capture_generator() made, by calling ferry.capture_table again with
-- the capture's own settings: `pgferry install` calls it after the function
-- files, so an upgrade brings the captures' code up to date as well (the
-- code generated per table is data, which the files do not replace). One row
-- per capture regenerated; error is what stopped one (the table held by
-- another transaction, a role that may not create its triggers, a setting
-- the table no longer allows), which is then left as it was and must be
-- captured again by hand: install goes on.
--
-- Calls:   ferry._capture_function, ferry._capture_generator, ferry.capture_table
-- Reads:   ferry.captures, pg_description
-- Writes:  what ferry.capture_table writes
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: pgferry install (the schema's owner)

create or replace function ferry._refresh_trigger_captures() returns table (tbl text, error text)
language plpgsql as $$
declare
    c record;
begin
    for c in
        select cap.relid::regclass as rel, cap.stream, cap.key_columns, cap.operations, cap.condition,
               cap.columns, cap.exclude_columns, cap.changed_columns
        from ferry.captures cap
        where cap.uncaptured_at is null and cap.method = 'trigger'
          and to_regclass(format('%I.%I', cap.schema_name, cap.table_name)) = cap.relid
          and exists (select 1 from unnest(cap.operations) op
                      where coalesce(obj_description(to_regprocedure(ferry._capture_function(cap.relid::regclass, op) || '()'),
                                                     'pg_proc'), '')
                            not like format('%%(generator %s)', ferry._capture_generator()))
        order by cap.id
    loop
        tbl := c.rel::text;
        begin
            perform ferry.capture_table(c.rel, c.stream, c.key_columns, c.operations, c.condition, c.columns,
                                        c.exclude_columns, c.changed_columns);
            error := null;
        exception when others then
            error := sqlerrm;
        end;
        return next;
    end loop;
end $$;
