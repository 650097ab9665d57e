-- ferry._wal_insert_position() returns pg_lsn
--
-- Where the next WAL record will start, as WAL capture's slot reports the
-- end of what it has read: every transaction committed before this call
-- has its commit record before it. pg_current_wal_insert_lsn() points past
-- a page's header when the last record ended at a page boundary, while the
-- slot's confirmed position is that boundary; so at the first usable byte of
-- a page this returns the page's start (no record ends inside a header), and
-- a fence taken there is not left waiting for a record that never comes.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._wal_insert_position() returns pg_lsn
language sql volatile as $$
    select case when o.in_page = 24 or (o.in_page = 40 and o.in_segment = 40) then l.at - o.in_page else l.at end
    from (select pg_current_wal_insert_lsn() as at) l,
         lateral (select ((l.at - '0/0'::pg_lsn) % current_setting('wal_block_size')::numeric)::integer as in_page,
                         ((l.at - '0/0'::pg_lsn) % pg_size_bytes(current_setting('wal_segment_size')))::integer as in_segment) o
$$;
