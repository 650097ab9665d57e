-- ferry._ensure_wal_slot(reset boolean default false) returns ferry.wal_slot
--
-- The logical replication slot and publication WAL capture uses, created
-- the first time a table is captured with method 'wal' (migration 0020).
-- The slot is pgferry_<database oid> (slot names are cluster-wide), the
-- publication pgferry_wal. Creating the slot must come before anything the
-- transaction writes, and needs the REPLICATION attribute (or superuser).
-- reset (ferry.reset_wal_slot): drop the slot that is there, if any, and
-- create a new one; ferry.wal_slot.note says where the log was complete.
-- Returns the row of ferry.wal_slot.
--
-- Calls:   -
-- Reads:   pg_replication_slots, pg_settings
-- Writes:  ferry.wal_slot, a replication slot, a publication; notifies pgferry_wal (a new slot)
-- Raises:  55000 (wal_level is not logical, or the slot is gone), 25000 (the transaction wrote before), 42501 (no REPLICATION)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._ensure_wal_slot(reset boolean default false) returns ferry.wal_slot
language plpgsql as $$
declare
    w ferry.wal_slot;
    v_slot name := 'pgferry_' || (select d.oid from pg_database d where d.datname = current_database());
    v_lsn pg_lsn;
    v_state text;
    v_message text;
begin
    select * into w from ferry.wal_slot;
    if found and reset then
        if exists (select 1 from pg_replication_slots s where s.slot_name = w.slot_name) then
            perform pg_drop_replication_slot(w.slot_name);
        end if;
    elsif found then
        if exists (select 1 from pg_replication_slots s where s.slot_name = w.slot_name) then
            return w;
        end if;
        -- Recreating it here would skip, unseen, whatever was written since it went.
        raise exception 'pgferry: the replication slot % that WAL capture reads is gone: changes made since are not in the log',
            w.slot_name using errcode = '55000',
            hint = 'Run select ferry.reset_wal_slot(); on its own, then `pgferry backfill` the tables captured with '
                   'method ''wal'' to send their current rows.';
    end if;
    if current_setting('wal_level') <> 'logical' then
        raise exception 'pgferry: capture from the WAL needs wal_level = logical (it is %)', current_setting('wal_level')
            using errcode = '55000',
                  hint = 'Set wal_level = logical in postgresql.conf and restart PostgreSQL, or capture with method => ''trigger''.';
    end if;
    select s.confirmed_flush_lsn into v_lsn from pg_replication_slots s where s.slot_name = v_slot;
    if v_lsn is null then
        begin
            select s.lsn into v_lsn from pg_create_logical_replication_slot(v_slot, 'pgoutput') s;
        exception when active_sql_transaction or feature_not_supported or object_not_in_prerequisite_state then
            get stacked diagnostics v_state = returned_sqlstate, v_message = message_text;
            raise exception 'pgferry: cannot create the replication slot for WAL capture: %', v_message
                using errcode = v_state,
                      hint = 'The first WAL capture creates the slot, which PostgreSQL allows only before the '
                             'transaction writes anything: run select ferry.capture_table(..., method => ''wal'') '
                             'on its own (or call select ferry._ensure_wal_slot() first, in its own transaction).';
        when insufficient_privilege then
            get stacked diagnostics v_message = message_text;
            raise exception 'pgferry: cannot create the replication slot for WAL capture: %', v_message
                using errcode = '42501',
                      hint = 'The role creating it and the relay''s role need the REPLICATION attribute: '
                             'alter role <name> replication;';
        end;
    end if;
    if not exists (select 1 from pg_publication p where p.pubname = 'pgferry_wal') then
        -- A partitioned table's changes as the table's own (the relid capture_table knows),
        -- not as its partitions'.
        create publication pgferry_wal with (publish_via_partition_root = true);
    end if;
    delete from ferry.wal_slot;
    insert into ferry.wal_slot (slot_name, publication, lsn, note)
    values (v_slot, 'pgferry_wal', v_lsn,
            case when w.lsn is not null
                 then format('reset at %s: the log was complete up to %s, changes after it and before %s were not captured',
                             now(), w.lsn, v_lsn) end)
    returning * into w;
    perform pg_notify('pgferry_wal', v_slot);  -- at commit: the relay starts streaming it now (capture/wal.py)
    return w;
end $$;
