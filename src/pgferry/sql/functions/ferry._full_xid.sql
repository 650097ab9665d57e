-- ferry._full_xid(low bigint, near xid8) returns xid8
--
-- The 64-bit transaction id whose low 32 bits are low (as the WAL and
-- pgoutput give them) nearest to near: less than 2^31 ids before or after
-- it, which PostgreSQL's wraparound protection makes true of any
-- transaction still being decoded when near is a recent id. Nearest, not
-- "at most near": the transaction appended may be newer than the one
-- appending it (a round of WAL capture stays open across many source
-- transactions), and newer than a snapshot's xmax (a transaction's commit
-- record is in the WAL, and can be decoded, a moment before it is marked
-- committed in the proc array, which snapshots read: seen at 1,000
-- transactions/s).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._full_xid(low bigint, near xid8) returns xid8
language sql immutable as $$
    select (near::text::bigint + ((low - near::text::bigint + 2147483648) & 4294967295) - 2147483648)::text::xid8
$$;
