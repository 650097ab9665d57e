-- ferry._ensure_wal_slot(reset boolean default false) returns ferry.wal_slot
--
-- The logical replication slot and publication WAL capture uses, created
-- the first time a table is captured with method 'wal' (migration 0020).
-- The slot is pgferry_<database oid> (slot names are cluster-wide), the
-- publication pgferry_wal, which pgferry install makes (migration 0024:
-- made here after the slot, a change committed in between stopped
-- decoding for good); made here only if someone dropped it. Creating the
-- slot must come before anything the transaction writes, and needs the
-- REPLICATION attribute (or superuser).
-- A slot that is gone, or that PostgreSQL invalidated (wal_status 'lost',
-- max_slot_wal_keep_size), is refused with the way out (reset_wal_slot):
-- recreating it here would skip, unseen, what was written since.
-- reset (ferry.reset_wal_slot): drop the slot that is there, if any, and
-- create a new one; ferry.wal_slot.note says where the log was complete, and
-- the changes in between are a gap of each consumer reading a WAL-captured
-- stream (ferry._record_wal_loss: the one the relay opened when it found the
-- slot lost is closed at the new slot's position).
-- Returns the row of ferry.wal_slot.
--
-- Calls:   ferry._record_wal_loss
-- Reads:   pg_replication_slots, pg_settings
-- Writes:  ferry.wal_slot, ferry.gaps (reset), a replication slot, a publication; notifies pgferry_wal (a new slot)
-- Raises:  55000 (wal_level is not logical, or the slot is gone or lost), 55006 (reset: a relay reads the slot), 25000 (the transaction wrote before), 42501 (no REPLICATION),
--          55P03 (lock_timeout passed while transactions in progress held back the slot's creation)
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
    v_timeout text;
    v_pid integer;
    v_wal_status text;
    v_problem text;
begin
    select * into w from ferry.wal_slot;
    if found and reset then
        select s.active_pid into v_pid from pg_replication_slots s where s.slot_name = w.slot_name and s.active;
        if v_pid is not null then
            raise exception 'pgferry: the replication slot % is being read by process % (a relay''s WAL capture): '
                            'it is not lost, and a reset would skip what it has not read', w.slot_name, v_pid
                using errcode = '55006',
                      hint = 'Reset only a slot status reports as lost or gone; to drop a healthy one, stop the relays first.';
        end if;
        select s.wal_status into v_wal_status from pg_replication_slots s where s.slot_name = w.slot_name;
        v_problem := case when not found then format('the replication slot %s was gone', w.slot_name)
                          when v_wal_status = 'lost'
                          then format('PostgreSQL invalidated the replication slot %s (max_slot_wal_keep_size)', w.slot_name)
                          else format('ferry.reset_wal_slot() replaced the replication slot %s', w.slot_name) end;
        if found then
            perform pg_drop_replication_slot(w.slot_name);
        end if;
    elsif found then
        select s.wal_status into v_wal_status from pg_replication_slots s where s.slot_name = w.slot_name;
        if found and v_wal_status = 'lost' then
            raise exception 'pgferry: PostgreSQL invalidated the replication slot % that WAL capture reads '
                            '(max_slot_wal_keep_size): changes committed after % are not in the log', w.slot_name, w.lsn
                using errcode = '55000',
                      hint = 'Run select ferry.reset_wal_slot(); on its own, then `pgferry backfill` the tables captured '
                             'with method ''wal'' to send their current rows (ferry.gaps records the hole).';
        elsif found then
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
        -- It waits for every transaction in progress (a prepared one too) to end: at most 10 s
        -- unless the caller set lock_timeout, as ferry._lock_for_capture waits for the table
        -- (it waited with no end and no word behind a forgotten prepared transaction: outside probe).
        v_timeout := current_setting('lock_timeout');
        if v_timeout = '0' then
            perform set_config('lock_timeout', '10s', true);
        end if;
        begin
            select s.lsn into v_lsn from pg_create_logical_replication_slot(v_slot, 'pgoutput') s;
        exception when lock_not_available then  -- (lock_timeout) a slot starts where no transaction in progress spans
            get stacked diagnostics v_message = message_text;
            raise exception 'pgferry: cannot create the replication slot for WAL capture: %: it waits for every '
                            'transaction in progress to end', v_message
                using errcode = '55P03',
                      hint = 'A session may be idle in a transaction (pg_stat_activity: state, xact_start) or a '
                             'prepared transaction left over (pg_prepared_xacts: COMMIT or ROLLBACK PREPARED it): end '
                             'it or wait, and call again (set lock_timeout to wait longer than 10 s).';
        when active_sql_transaction or feature_not_supported or object_not_in_prerequisite_state then  -- (55000: its class)
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
        perform set_config('lock_timeout', v_timeout, true);
    end if;
    if not exists (select 1 from pg_publication p where p.pubname = 'pgferry_wal') then
        -- A partitioned table's changes as the table's own (the relid capture_table knows),
        -- not as its partitions'.
        create publication pgferry_wal with (publish_via_partition_root = true);
    end if;
    if w.lsn is not null then  -- a reset: what the old slot had not brought is lost
        perform ferry._record_wal_loss(v_problem, v_lsn);
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
