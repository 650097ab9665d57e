-- pgferry 0040: a primary key's INCLUDE columns are not part of the key.
--
-- capture_table and ferry.backfill_chunk took a primary key's columns from
-- pg_index.indkey, which lists its INCLUDE columns after its key columns:
-- `primary key (id) include (v)` keyed every event by [id, v], so each update
-- of v looked like a key change (ordered delivery, partitions by key hash and
-- latest-per-key readers), and backfills keyed their READ events the same
-- way (outside probe). capture_table now takes the first indnkeyatts columns.
--
-- Captures made so far keep the key_columns they stored: this recomputes
-- those equal to all of their table's primary key columns, INCLUDE columns
-- too, in index order (which is what the default gave; key_columns named by
-- hand in exactly that order are taken for it too, and a key that held an
-- INCLUDE column after a unique column was never more unique than without
-- it). A WAL capture reads key_columns at each append, so its next events
-- have the right key. A trigger capture's generated functions hold the key
-- expression: ferry._capture_generator() went to 3, so install regenerates
-- them with the key_columns set here. The key of such a table's events
-- changes once, at the upgrade, instead of at every update of v.
--
-- A backfill of such a table, running or paused, recorded its last key as
-- {id, v} (and its shape, migration 0033) and would fail as one whose
-- primary key changed: its last key loses the INCLUDE columns, which
-- changes nothing of where it stands (the key columns are unique alone).

update ferry.captures c
set key_columns = k.key_only
from pg_index i
cross join lateral (
    select array_agg(a.attname::text order by x.ord) filter (where x.ord <= i.indnkeyatts) as key_only,
           array_agg(a.attname::text order by x.ord) as all_columns
    from unnest(i.indkey) with ordinality x(attnum, ord)
    join pg_attribute a on a.attrelid = i.indrelid and a.attnum = x.attnum) k
where c.uncaptured_at is null and i.indrelid = c.relid and i.indisprimary and i.indnatts > i.indnkeyatts
  and c.key_columns = k.all_columns;

update ferry.backfills b
set last_key = b.last_key - k.included,
    last_key_columns = b.last_key_columns[1:i.indnkeyatts]  -- NULL before 0033: the names in last_key alone
from pg_index i
cross join lateral (
    select array_agg(a.attname::text) as included
    from unnest(i.indkey) with ordinality x(attnum, ord)
    join pg_attribute a on a.attrelid = i.indrelid and a.attnum = x.attnum
    where x.ord > i.indnkeyatts) k
where b.state in ('running', 'paused') and b.last_key is not null
  and i.indrelid = b.relid and i.indisprimary and i.indnatts > i.indnkeyatts
  and b.last_key ?& k.included
  and (b.last_key_columns is null or cardinality(b.last_key_columns) = i.indnatts);
