-- ferry._current_partition() returns smallint
--
-- The partition writers append to right now. Callers must already hold their
-- transaction id (see ferry.publish) so that rotation can bound late writers.
-- No FROM clause on purpose: the function is inlined into its callers instead
-- of being parsed and planned on every call (measured: ~16 us per call).
-- pg_sequence_last_value is NULL only before the first setval (start 0).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._current_partition() returns smallint
language sql volatile as $$
    select coalesce(pg_sequence_last_value('ferry.current_partition_seq'::regclass), 0)::smallint
$$;
