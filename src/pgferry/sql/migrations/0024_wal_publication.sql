-- pgferry 0024: the publication WAL capture reads is made at install, long
-- before any slot. The first ferry.capture_table(..., method => 'wal')
-- created the slot and then the publication in one transaction (a slot
-- must be created before its transaction writes): a change committed by
-- anyone between the two was decoded with a catalog in which the
-- publication did not exist yet, and pgoutput stopped there for good
-- ("publication pgferry_wal does not exist", outside probe: any write to
-- any table while the first WAL capture ran). Made now, it exists in every
-- catalog snapshot a slot can decode. Empty until a table is captured from
-- the WAL; made whatever wal_level is (PostgreSQL then warns that it cannot
-- publish yet, which matters only to WAL capture, and says so itself).

do $$
declare
    v_level text := current_setting('client_min_messages');
begin
    if not exists (select 1 from pg_publication where pubname = 'pgferry_wal') then
        perform set_config('client_min_messages', 'error', true);
        -- A partitioned table's changes as the table's own (the relid capture_table knows).
        create publication pgferry_wal with (publish_via_partition_root = true);
        perform set_config('client_min_messages', v_level, true);
    end if;
end $$;
