-- ferry._wal_identity_problems(relid regclass default null) returns table (tbl regclass, problem text)
--
-- The tables captured from the WAL whose REPLICA IDENTITY, as it is now,
-- keeps their events from being what capture_table promised, each with the
-- fix in its text. capture_table refuses such a table (and sets DEFAULT to
-- FULL); this finds the ones changed since by ALTER TABLE ... REPLICA
-- IDENTITY, which pgferry cannot refuse: NOTHING (PostgreSQL then refuses
-- the table's UPDATEs and DELETEs), an index or a primary key without all of
-- the capture's key columns (its DELETEs reach readers with a null key, out
-- of their key's order), and anything but FULL under a condition or
-- changed_columns (they are evaluated on whole old rows); and, whatever the
-- identity, key columns the table no longer has (renamed or dropped: every
-- event came with a null key, and nothing said so; outside probe), whose
-- fix is capture_table again; inheritance children gained since (their
-- rows' changes through the table are not in its WAL); and a partition
-- short of FULL under a FULL table (attached since: its UPDATEs lose
-- old_record); and, before all of these, a table no longer in the
-- publication pgferry_wal (altered by hand: alter publication ... drop
-- table), or the publication gone: its later changes were lost without a
-- word (outside probe), so the text says they are lost and how to capture
-- and backfill it again; and the publication altered by hand so that it no
-- longer publishes every kind of change (publish narrowed: those changes
-- are lost) or, for a partitioned table, sends its partitions' changes as
-- theirs (publish_via_partition_root off: the relay captures the root's
-- relation only, so they are all lost). A partitioned
-- table's partitions count, as capture_table checks them. relid: only the
-- capture of that table (the relay asks about each table the WAL describes;
-- a query over all of them for each would grow with their square). Shown by `pgferry
-- status`, the dashboard and metrics (pgferry_wal_identity_problems); the
-- relay logs it when the WAL describes such a table.
--
-- Calls:   -
-- Reads:   ferry.captures, ferry.wal_slot, pg_class, pg_index, pg_attribute, pg_inherits, pg_partition_tree,
--          pg_publication, pg_publication_rel
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default); the relay and the operator commands

create or replace function ferry._wal_identity_problems(relid regclass default null)
returns table (tbl regclass, problem text)
language sql stable as $$
    with parts as (
        select c.id, c.relid, c.key_columns, (c.condition is not null or c.changed_columns is not null) as needs_full,
               c.operations, p.relid as part
        from ferry.captures c
        cross join lateral (select c.relid union select t.relid from pg_partition_tree(c.relid) t
                            where t.level > 0 and t.relid in (select oid from pg_class where relkind in ('r', 'p'))) p(relid)
        where c.method = 'wal' and c.uncaptured_at is null
          and (_wal_identity_problems.relid is null or c.relid = _wal_identity_problems.relid)
    ),
    identity as (
        select p.*, k.relreplident,
               case k.relreplident
                   when 'i' then (select i.indexrelid from pg_index i where i.indrelid = p.part and i.indisreplident)
                   when 'd' then (select i.indexrelid from pg_index i where i.indrelid = p.part and i.indisprimary)
               end as index,
               array(select a.attname::text from pg_index i join pg_attribute a on a.attrelid = p.part
                                                             and a.attnum = any (i.indkey[0:i.indnkeyatts - 1])
                     where i.indrelid = p.part
                       and ((k.relreplident = 'i' and i.indisreplident) or (k.relreplident = 'd' and i.indisprimary)))
                   as index_columns,
               array(select a.attname::text from pg_attribute a
                     where a.attrelid = p.part and a.attnum > 0 and not a.attisdropped) as table_columns,
               (select r.relreplident from pg_class r where r.oid = p.relid) as root_identity,
               (select i.inhrelid::regclass from pg_inherits i where i.inhparent = p.part and k.relkind = 'r' limit 1)
                   as child,
               -- the table itself (not its partitions: the root is published) out of the publication
               (select w.publication from ferry.wal_slot w) as publication,
               p.part = p.relid and not exists (
                   select 1 from ferry.wal_slot w join pg_publication pb on pb.pubname = w.publication
                   join pg_publication_rel pr on pr.prpubid = pb.oid
                   where pr.prrelid = p.relid) as unpublished,
               exists (select 1 from ferry.wal_slot w join pg_publication pb on pb.pubname = w.publication)
                   as publication_exists,
               -- the table itself, not each of its partitions again
               case when p.part = p.relid then
               -- (of the kinds its capture takes: TRUNCATE always, from the WAL)
               (select array_to_string(array_remove(array[
                           case when not pb.pubinsert and 'insert' = any (p.operations) then 'insert' end,
                           case when not pb.pubupdate and 'update' = any (p.operations) then 'update' end,
                           case when not pb.pubdelete and 'delete' = any (p.operations) then 'delete' end,
                           case when not pb.pubtruncate then 'truncate' end], null), ', ')
                from ferry.wal_slot w join pg_publication pb on pb.pubname = w.publication) end as unpublished_kinds,
               p.part = p.relid and k.relkind = 'p' and exists (
                   select 1 from ferry.wal_slot w join pg_publication pb on pb.pubname = w.publication
                   where not pb.pubviaroot) as partitions_as_theirs
        from parts p join pg_class k on k.oid = p.part
    )
    select i.part::regclass,
           case
               when i.unpublished and not i.publication_exists then
                   format('the publication %s is gone (dropped by hand?): its changes since are not captured and are '
                          'lost, and the slot cannot decode past the drop; stop the relays, create publication %I with '
                          '(publish_via_partition_root = true), add the tables captured from the WAL back, select '
                          'ferry.reset_wal_slot(), start the relays and pgferry backfill those tables',
                          i.publication, i.publication)
               when i.unpublished then
                   format('it is not in the publication %s any more (altered by hand?): its changes since are not '
                          'captured and are lost; call ferry.capture_table(%L, method => ''wal'') again, with the '
                          'options it was captured with (or alter publication %I add table only %s), then pgferry '
                          'backfill it', i.publication, i.relid::regclass::text, i.publication, i.relid::regclass)
               when i.unpublished_kinds <> '' then
                   format('the publication %s does not publish %s any more (altered by hand?): those changes of it '
                          'since are not captured and are lost; alter publication %I set (publish = ''insert, update, '
                          'delete, truncate''), then pgferry backfill it', i.publication, i.unpublished_kinds,
                          i.publication)
               when i.partitions_as_theirs then
                   format('the publication %s sends the changes of its partitions as theirs (publish_via_partition_root '
                          'turned off by hand?): they are not captured and are lost; alter publication %I set '
                          '(publish_via_partition_root = true), then pgferry backfill it', i.publication, i.publication)
               when not (i.key_columns <@ i.table_columns) then
                   format('its key columns (%s) are not all columns of the table any more (renamed or dropped): its '
                          'events reach readers with a null key; call ferry.capture_table(%L, method => ''wal'') '
                          'again, with the options it was captured with, to key it by the table as it is now',
                          array_to_string(i.key_columns, ', '), i.relid::regclass::text)
               when i.relreplident = 'n' or (i.relreplident = 'd' and i.index is null) then
                   format('REPLICA IDENTITY %s: PostgreSQL refuses its UPDATEs and DELETEs while it is captured from '
                          'the WAL; alter table %s replica identity full',
                          case when i.relreplident = 'n' then 'NOTHING' else 'DEFAULT without a primary key' end, i.part::regclass)
               when i.relreplident in ('i', 'd') and not (i.key_columns <@ i.index_columns) then
                   format('REPLICA IDENTITY %s holds not all of its key columns (%s): its DELETEs reach readers with a '
                          'null key; alter table %s replica identity full (or using index on the key)',
                          case when i.relreplident = 'i' then 'USING INDEX ' || i.index::regclass::text
                               else 'DEFAULT (the primary key)' end,
                          array_to_string(i.key_columns, ', '), i.part::regclass)
               when i.relreplident <> 'f' and i.needs_full then
                   format('REPLICA IDENTITY %s gives only the key of old rows, and its capture''s condition or '
                          'changed_columns looks at whole old rows (its events differ from what triggers write); '
                          'alter table %s replica identity full',
                          case when i.relreplident = 'i' then 'USING INDEX ' || i.index::regclass::text else 'DEFAULT' end,
                          i.part::regclass)
               when i.child is not null then
                   format('it has inheritance children (%s, ...): the WAL gives their rows'' changes as theirs, so '
                          'those made through it are not captured; capture it with method => ''trigger''',
                          i.child)
               when i.part <> i.relid and i.relreplident <> 'f' and i.root_identity = 'f' then
                   format('a partition with REPLICA IDENTITY %s (attached after the capture?) under a table with '
                          'FULL: its UPDATEs come with no old_record and without unchanged TOASTed values; '
                          'alter table %s replica identity full',
                          case when i.relreplident = 'i' then 'USING INDEX ' || i.index::regclass::text else 'DEFAULT' end,
                          i.part::regclass)
           end
    from identity i
    where i.unpublished
       or i.unpublished_kinds <> ''
       or i.partitions_as_theirs
       or not (i.key_columns <@ i.table_columns)
       or i.relreplident = 'n' or (i.relreplident = 'd' and i.index is null)
       or (i.relreplident in ('i', 'd') and not (i.key_columns <@ i.index_columns))
       or (i.relreplident <> 'f' and i.needs_full)
       or i.child is not null
       or (i.part <> i.relid and i.relreplident <> 'f' and i.root_identity = 'f')
    order by 1::text
$$;
