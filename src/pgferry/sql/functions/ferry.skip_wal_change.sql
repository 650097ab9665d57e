-- ferry.skip_wal_change(at pg_lsn) returns text
--
-- The operator's way past one change WAL capture cannot append because the
-- log cannot hold it (migration 0037): a json value jsonb refuses, such as
-- {"a": 1e1000000} or a string holding \u0000, which PostgreSQL's json
-- keeps and a trigger would have refused, but which the WAL has committed.
-- No correction reaches such a change, and ferry.reset_wal_slot() (with
-- every relay stopped) makes every WAL-captured table's changes not yet
-- appended a gap. This names the one change, by the position the relay's
-- error gives ("A change of it (at X/Y)"): at its next try (every few
-- seconds, no restart) WAL capture leaves it out and records it, in the
-- same transaction as the append, as a gap of each consumer reading its
-- stream (ferry._record_wal_skip: cause 'wal change skipped'), whose
-- reason names the row to resend with `pgferry backfill <table> --where
-- <its key>`. A change at that position the log can hold is appended as
-- usual. Several positions may be pending (one transaction may hold
-- several such changes); each leaves ferry.wal_slot.skip_lsns once
-- recorded. Returns what will happen.
-- Refused: no WAL capture (no slot), a lost slot (those changes are a gap
-- already: reset_wal_slot), a position WAL capture has passed (before the
-- slot's restart_lsn: every change not yet appended is at or after it; a
-- change before ferry.wal_slot.lsn may still be pending, its transaction
-- committing after it) or not written yet.
--
-- Calls:   -
-- Reads:   ferry.wal_slot, pg_replication_slots
-- Writes:  ferry.wal_slot
-- Raises:  22004 (at is NULL), 55000 (no WAL capture, or its slot is lost), 22023 (at is passed or not written yet)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.skip_wal_change(at pg_lsn) returns text
language plpgsql as $$
declare
    w ferry.wal_slot;
    v_restart pg_lsn;
    v_status text;
begin
    if at is null then
        raise exception 'pgferry: skip_wal_change needs the position of the change to skip' using errcode = '22004',
            hint = 'Give the position the relay''s error names ("A change of it (at X/Y)"): select ferry.skip_wal_change(''X/Y'');';
    end if;
    select * into w from ferry.wal_slot for update;
    if not found then
        raise exception 'pgferry: nothing is captured from the WAL here: there is no change to skip' using errcode = '55000',
            hint = 'ferry.skip_wal_change is for WAL capture (ferry.capture_table(..., method => ''wal'')), which holds '
                   'at a change it cannot append; a trigger-captured table refuses such a write in the writer''s transaction.';
    end if;
    select s.restart_lsn, s.wal_status into v_restart, v_status from pg_replication_slots s where s.slot_name = w.slot_name;
    if not found or v_status = 'lost' or w.invalidated_at is not null then
        raise exception 'pgferry: WAL capture''s replication slot % is lost: the changes after % never reach the log, '
                        'and there is nothing to skip', w.slot_name, w.lsn using errcode = '55000',
            hint = 'Those changes are a gap already (ferry.gaps): run select ferry.reset_wal_slot(); then `pgferry backfill` '
                   'each table captured with method ''wal''.';
    end if;
    if at < v_restart then
        raise exception 'pgferry: WAL capture has passed % already: every change it has yet to append is at or after % '
                        '(the log is complete up to %)', at, v_restart, w.lsn using errcode = '22023',
            hint = 'Give the position the relay''s error names now (pgferry status: "A change of it (at X/Y)").';
    end if;
    if at > pg_current_wal_insert_lsn() then
        raise exception 'pgferry: % is not written yet (the WAL ends at %)', at, pg_current_wal_insert_lsn()
            using errcode = '22023',
            hint = 'Give the position the relay''s error names (pgferry status: "A change of it (at X/Y)").';
    end if;
    update ferry.wal_slot
    set skip_lsns = array(select distinct s from unnest(coalesce(skip_lsns, '{}') || at) s order by s);
    return format('WAL capture leaves out the change at %s at its next try (within seconds, no restart) if the log '
                  'cannot hold it, and records it as a gap of each consumer reading its table (ferry.gaps, cause '
                  '''wal change skipped''; `pgferry retention show`), whose reason names the row to resend with '
                  '`pgferry backfill <table> --where <its key>`; a change there the log can hold is appended as usual',
                  at)
           || case when w.skip_lsns is not null and not at = any (w.skip_lsns)
                   then format('. Also pending: %s', array_to_string(w.skip_lsns, ', ')) else '' end;
end $$;
