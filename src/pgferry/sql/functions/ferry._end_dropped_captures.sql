-- ferry._end_dropped_captures() returns text[]
--
-- Ends the captures of tables that were dropped (DROP TABLE calls no pgferry
-- function): their ferry.captures rows get uncaptured_at, as
-- ferry.uncapture_table gives them, so that `pgferry status` stops listing
-- them as captured (an outside probe found a table captured, dropped and
-- made again 9 times listed 9 times) and WAL capture stops counting them. A
-- WAL capture's uncaptured_lsn is the WAL position now: its changes from
-- before the drop are still appended when decoded (migration 0022). The
-- generated trigger functions of a dropped table stay (the relay may not drop
-- them; they are called by nothing).
--
-- Returns: a line for the relay's log per table.
-- Calls:   -
-- Reads:   pg_class
-- Writes:  ferry.captures
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: ferry.housekeeping (the relay)

create or replace function ferry._end_dropped_captures() returns text[]
language sql as $$
    with ended as (
        update ferry.captures c set uncaptured_at = now(),
                                    uncaptured_lsn = case when c.method = 'wal' then pg_current_wal_insert_lsn() end
        where c.uncaptured_at is null and not exists (select 1 from pg_class r where r.oid = c.relid)
        returning c.schema_name, c.table_name, c.method)
    select coalesce(array_agg(format('table %I.%I was dropped: its capture (%s) ended', e.schema_name, e.table_name,
                                     e.method) order by e.schema_name, e.table_name), '{}')
    from ended e
$$;

grant execute on function ferry._end_dropped_captures() to ferry_relay;
