-- ferry._wait_for_wal_capture(tbl regclass) returns void
--
-- Before a table captured from the WAL goes to triggers (ferry.capture_table
-- with method 'trigger'), waits until WAL capture has appended every change
-- of it committed so far, so that the trigger's events, whose ids are drawn
-- as they are written, come after them. Without the wait a change made by
-- WAL just before the switch got its event id when the relay appended it,
-- after the trigger events of the row's next changes: an ordered
-- subscription received a row's stale value last (outside probe). Called
-- with the table locked (ferry._lock_for_capture), so no writer of it is
-- half-way through a transaction: the WAL insert position now is past every
-- change of the table, and the wait is over when the slot's confirmed
-- position (the relay confirms only what it has appended and committed)
-- reaches it. Also waits when the table's WAL capture ended earlier
-- (ferry.uncapture_table) and its changes are not all appended yet.
-- Nothing to wait for: no WAL capture of the table, or the slot is lost (its
-- changes never reach the log; ferry.reset_wal_slot records the gap). A
-- table with no change since its WAL capture began waits as well: which
-- changes the slot holds is not known without decoding it.
-- The WAL insert position counts this transaction's own records too (the
-- lock's), which no WAL sender sends before something commits: on an idle
-- database the switch waited its whole 10 s and failed with a relay
-- streaming (the slot confirmed 64 bytes short; found by a flaky test). So
-- once asynchronous commits have had their time to reach the disk (three
-- times wal_writer_delay, PostgreSQL's bound), the wait ends at the flushed
-- position instead, if that comes first: what is past it then was
-- committed by no one. (Should this transaction's first record straddle a
-- WAL page, the page's end is flushed and the record is not whole there:
-- the wait runs out with the error below; calling again is the remedy.)
-- Waits at most the setting pgferry.switch_wait (an interval, default 10 s),
-- then raises 55000 with what holds WAL capture: the writers of the table
-- queue behind its lock meanwhile.
--
-- Calls:   ferry._wal_insert_position
-- Reads:   ferry.captures, ferry.wal_slot, pg_replication_slots, pg_current_wal_flush_lsn()
-- Writes:  -
-- Raises:  55000 (WAL capture did not catch up in time), 22007 (pgferry.switch_wait is not an interval)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: ferry.capture_table

create or replace function ferry._wait_for_wal_capture(tbl regclass) returns void
language plpgsql as $$
declare
    v_slot      text;
    v_to        pg_lsn;
    v_confirmed pg_lsn;
    v_active    boolean;
    v_wait      interval := coalesce(nullif(current_setting('pgferry.switch_wait', true), ''), '10 s')::interval;
    v_until     timestamptz;
    v_settled   timestamptz;  -- when every asynchronous commit before the call is flushed
    v_error     text;
begin
    select w.slot_name, w.error into v_slot, v_error from ferry.wal_slot w where w.invalidated_at is null;
    if v_slot is null then
        return;  -- no slot, or a lost one: nothing more of the table will come from the WAL
    end if;
    select s.confirmed_flush_lsn into v_confirmed from pg_catalog.pg_replication_slots s where s.slot_name = v_slot;
    if v_confirmed is null then
        return;  -- dropped by hand: the relay reports it lost
    end if;
    if not exists (select 1 from ferry.captures c
                   where c.relid = tbl and c.method = 'wal'
                     and (c.uncaptured_at is null or c.uncaptured_lsn > v_confirmed)) then
        return;
    end if;
    v_to := ferry._wal_insert_position();
    v_until := clock_timestamp() + v_wait;
    v_settled := clock_timestamp() + 3 * current_setting('wal_writer_delay')::interval + interval '100 ms';
    loop
        select s.confirmed_flush_lsn, s.active into v_confirmed, v_active
        from pg_catalog.pg_replication_slots s where s.slot_name = v_slot;
        exit when v_confirmed is null or v_confirmed >= v_to;
        if v_settled is not null and clock_timestamp() >= v_settled then
            v_to := least(v_to, pg_current_wal_flush_lsn());
            v_settled := null;
            continue;
        end if;
        if clock_timestamp() >= v_until then
            select w.error into v_error from ferry.wal_slot w;
            raise exception 'pgferry: % cannot go to trigger capture yet: WAL capture has not read the WAL up to '
                            'this switch, and changes of the table made before it may not be in the log (the slot '
                            'is confirmed up to %, the switch needs %; %)',
                            tbl, v_confirmed, v_to,
                            case when v_error is not null then 'WAL capture is failing: ' || v_error
                                 when not v_active then 'no relay is streaming the slot'
                                 else 'WAL capture is behind' end
                using errcode = '55000',
                      hint = 'Its trigger events would reach readers before those changes, out of order. Start a relay '
                             '(pgferry run) or fix what pgferry status says about WAL capture, then call again; '
                             'set pgferry.switch_wait (e.g. ''60s'') to wait longer than 10 s.';
        end if;
        perform pg_sleep(0.02);
    end loop;
end $$;
