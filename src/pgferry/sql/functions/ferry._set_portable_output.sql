-- ferry._set_portable_output() returns void
--
-- Sets, until the end of the caller's transaction (or its subtransaction's
-- rollback), the output settings under which a value's text reads back as
-- the same value in any session: DateStyle ISO (under 'SQL, DMY' a date
-- came out 05/01/2026, May 1 to a session on the default MDY; a timestamptz
-- came out with a zone abbreviation PostgreSQL reads as another zone),
-- IntervalStyle postgres and extra_float_digits 3 (0 printed 0.3 for both
-- 0.3 and 0.30000000000000004, so a backfill keyed by it never moved on),
-- and bytea_output hex (as the WAL capture's replication session reads).
-- For text pgferry stores to be read again by another session: deparsed
-- capture and backfill conditions, a backfill's last key.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._set_portable_output() returns void language sql as $$
    select set_config('datestyle', 'ISO, YMD', true),
           set_config('intervalstyle', 'postgres', true),
           set_config('extra_float_digits', '3', true),
           set_config('bytea_output', 'hex', true)
$$;
