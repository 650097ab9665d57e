-- ferry._full_xid(low bigint, newer xid8) returns xid8
--
-- The 64-bit transaction id whose low 32 bits are low (as the WAL and
-- pgoutput give them), for a transaction that started before newer (e.g.
-- pg_snapshot_xmax(pg_current_snapshot()), which no assigned id reaches) and
-- less than 2^32 ids ago, which PostgreSQL's wraparound protection makes
-- true of any transaction still being decoded. Not the caller's own id: a
-- decoded transaction may have started after the one appending it (a round
-- of WAL capture stays open across many source transactions).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._full_xid(low bigint, newer xid8) returns xid8
language sql immutable as $$
    select (newer::text::bigint - ((newer::text::bigint - low) & 4294967295))::text::xid8
$$;
