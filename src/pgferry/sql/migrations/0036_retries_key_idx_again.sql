-- pgferry 0036: retries_key_idx as 0035 makes it, in every database.
--
-- 0035 was edited after it was committed (ff0ce69 made a hash index on the
-- key alone; d7f4ce1 the btree on the subscription and the key's hash), and a
-- database applies a migration once: those installed from code of those 50
-- minutes kept the hash index, whose retry reads took 11.8 ms instead of
-- 1.6 ms with 1,000 subscriptions parked on the same keys (outside probe: an
-- upgraded catalog compared with a fresh one). tests/sql/migrations.sha256
-- now holds every migration's checksum, so that a change to one that shipped
-- fails the tests.

do $$
begin
    if not exists (select 1 from pg_indexes
                   where schemaname = 'ferry' and indexname = 'retries_key_idx'
                     and indexdef like '%(subscription, hashtextextended(key, (0)::bigint), event_id)%') then
        drop index if exists ferry.retries_key_idx;
        create index retries_key_idx on ferry.retries (subscription, hashtextextended(key, 0), event_id);
    end if;
end $$;
