-- ferry.uncapture_table(tbl regclass) returns void
--
-- Stops capturing a table: drops its capture triggers and generated
-- functions (also those of captures made before migration 0003) and marks
-- its ferry.captures rows as ended (they stay: events still point at them;
-- a WAL capture's changes made before the end are still appended, 0022).
-- A table captured from the WAL leaves the publication (its REPLICA
-- IDENTITY is left as it is).
--
-- Calls:   ferry._capture_function
-- Reads:   ferry.wal_slot
-- Writes:  ferry.captures, the publication
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.uncapture_table(tbl regclass) returns void
language plpgsql as $$
declare
    v_op text;
begin
    foreach v_op in array array['insert', 'update', 'delete'] loop
        if exists (select 1 from pg_trigger where tgrelid = tbl and tgname = 'pgferry_capture_' || v_op) then
            execute format('drop trigger pgferry_capture_%s on %s', v_op, tbl);
        end if;
        if to_regprocedure(ferry._capture_function(tbl, v_op) || '()') is not null then  -- no NOTICE if not
            execute format('drop function %s()', ferry._capture_function(tbl, v_op));
        end if;
    end loop;
    -- The single function of captures made before 0003.
    if to_regprocedure(ferry._capture_function(tbl) || '()') is not null then
        execute format('drop function %s()', ferry._capture_function(tbl));
    end if;
    -- WAL capture (0020): out of the publication, so the relay decodes nothing more of it.
    if exists (select 1 from ferry.wal_slot w join pg_publication p on p.pubname = w.publication
               join pg_publication_rel pr on pr.prpubid = p.oid where pr.prrelid = tbl) then
        execute format('alter publication %I drop table %s', (select w.publication from ferry.wal_slot w), tbl);
    end if;
    -- A WAL capture's changes before this point in the WAL are still appended when decoded (0022).
    update ferry.captures set uncaptured_at = now(),
                              uncaptured_lsn = case when method = 'wal' then pg_current_wal_insert_lsn() end
    where relid = tbl and uncaptured_at is null;
end $$;
