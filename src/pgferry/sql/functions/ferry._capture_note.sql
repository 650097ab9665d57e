-- ferry._capture_note(tbl regclass, method text) returns text
--
-- What a capture of tbl by method will not see, in one line, or NULL when
-- it sees every write. Statement triggers fire on the table a statement
-- names: those of a partitioned table do not fire for a statement that
-- names one of its partitions, and a partition's do not fire for a
-- statement that names its parent (PostgreSQL allows transition tables on
-- neither the other way round). Both were accepted without a word and lost
-- changes (outside probe). Inheritance (not partitions) is the same: an
-- UPDATE or DELETE through a parent of a child's rows fires the parent's
-- triggers, not the child's (the child's stream misses it, the parent's
-- gets the child's row under the parent's columns and key: two different
-- rows "U 1"; outside probe); a NOTICE names it for either table. From
-- the WAL every change of a published table
-- or of its partitions is seen, whichever table the statement named.
-- ferry.capture_table raises it as a NOTICE; `pgferry capture` prints it
-- as a warning.
--
-- Parameters: tbl     the table
--             method  'trigger' or 'wal'
-- Returns:    the note, or NULL.
-- Calls:      -
-- Reads:      pg_class, pg_inherits
-- Writes:     -
-- Raises:     -
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._capture_note(tbl regclass, method text) returns text
language sql stable as $$
    select case
        when method is distinct from 'trigger' then null
        when c.relkind = 'p' then format(
            'writes that name a partition of %1$s directly (insert into a partition, not into %1$s) are not '
            'captured by its triggers; capture it from the WAL (method => ''wal'', or pgferry capture --method wal) to see those too', tbl)
        when c.relispartition then format(
            '%1$s is a partition of %2$s: writes through %2$s are not captured by its triggers; capture %2$s '
            'from the WAL (method => ''wal'', or pgferry capture --method wal) to see every write to its partitions', tbl,
            (select i.inhparent::regclass from pg_inherits i where i.inhrelid = tbl))
        when exists (select 1 from pg_inherits i where i.inhrelid = tbl) then format(
            '%1$s inherits from %2$s: an UPDATE or DELETE through %2$s (update %2$s ..., not update only %2$s) of '
            'rows of %1$s is not captured by its triggers (it fires those of %2$s, whose stream gets the rows with '
            '%2$s''s columns); write to %1$s by its own name, or capture %2$s and read its stream too', tbl,
            (select i.inhparent::regclass from pg_inherits i where i.inhrelid = tbl order by i.inhseqno limit 1))
        when exists (select 1 from pg_inherits i where i.inhparent = tbl) then format(
            '%1$s has inheritance children (%2$s, ...): an UPDATE or DELETE through %1$s of their rows reaches its '
            'stream as rows of %1$s (its columns, keys that may collide with its own rows'') and not their own '
            'captures; write to the children by their own names (or to only %1$s), and capture each child; '
            'a backfill of %1$s reads its own rows only', tbl,
            (select i.inhrelid::regclass from pg_inherits i where i.inhparent = tbl order by i.inhrelid limit 1))
    end
    from pg_class c where c.oid = tbl
$$;
