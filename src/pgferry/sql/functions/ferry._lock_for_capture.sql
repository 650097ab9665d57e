-- ferry._lock_for_capture(tbl regclass) returns void
--
-- Locks a table for a change of its capture (SHARE ROW EXCLUSIVE, until
-- the transaction ends): no writer's transaction is then half-way through
-- it, so each change belongs wholly to the capture before or the one after
-- (ferry.capture_table, ferry.uncapture_table). A transaction holding the
-- table (a writer idle in transaction) would make this wait, and every
-- writer queued behind this lock with it: when the caller set no
-- lock_timeout, the wait is bounded at 10 s and ends in an error that says
-- what to do, instead of holding the table's writers indefinitely.
--
-- Calls:   -
-- Reads:   -
-- Writes:  - (a lock)
-- Raises:  55P03 (the lock was not granted in time)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._lock_for_capture(tbl regclass) returns void
language plpgsql as $$
declare
    v_timeout text := current_setting('lock_timeout');
begin
    if v_timeout = '0' then
        perform set_config('lock_timeout', '10s', true);
    end if;
    begin
        execute format('lock table %s in share row exclusive mode', tbl);
    exception when lock_not_available then
        raise exception 'pgferry: % is held by another transaction; its capture cannot change while it runs', tbl
            using errcode = '55P03',
                  hint = 'A writer may be idle in a transaction: see pg_stat_activity and pg_locks for the table, '
                         'end it or wait, and call again (set lock_timeout to wait longer than 10 s).';
    end;
    perform set_config('lock_timeout', v_timeout, true);
end $$;
