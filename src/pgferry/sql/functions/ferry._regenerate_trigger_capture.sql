-- ferry._regenerate_trigger_capture(capture integer) returns text
--
-- Generates a trigger capture's code again, with its own settings, by calling
-- ferry.capture_table for its table (found by oid: it may have been renamed
-- or moved since, and a lookup by its recorded name skipped it silently;
-- outside probe). `pgferry install` calls it, after the install committed,
-- in a transaction per capture, for each capture whose generated functions
-- an earlier ferry._capture_generator() made (queries.sql,
-- stale_trigger_captures): the code generated per table is data, which the
-- function files do not replace, and older code wrote a column named r as
-- the whole record. One transaction each: inside the install's own, the
-- captured tables' locks came after ferry.events', the reverse of their
-- writers', and every writer failed with a deadlock (outside probe).
-- Returns NULL, or what stopped it (the table held by another transaction
-- for 10 s, a role that may not create its triggers, a setting the table no
-- longer allows), leaving the capture as it was.
--
-- Calls:   ferry.capture_table
-- Reads:   ferry.captures
-- Writes:  what ferry.capture_table writes
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: pgferry install (the schema's owner)

create or replace function ferry._regenerate_trigger_capture(capture integer) returns text
language plpgsql as $$
declare
    c record;
begin
    select cap.relid::regclass as rel, cap.stream, cap.key_columns, cap.operations, cap.condition, cap.columns,
           cap.exclude_columns, cap.changed_columns
    into c
    from ferry.captures cap
    where cap.id = _regenerate_trigger_capture.capture and cap.uncaptured_at is null and cap.method = 'trigger'
      and exists (select 1 from pg_class r where r.oid = cap.relid);
    if not found then
        return null;  -- uncaptured or dropped meanwhile
    end if;
    perform ferry.capture_table(c.rel, c.stream, c.key_columns, c.operations, c.condition, c.columns,
                                c.exclude_columns, c.changed_columns);
    return null;
exception when others then
    return sqlerrm;
end $$;
