-- pgferry 0041: at most one running or paused backfill per table and target, as an index.
--
-- ferry.backfill refused a second backfill of a table for the same target
-- after looking under a per-table advisory lock, but a caller whose snapshot
-- was taken before the lock (REPEATABLE READ: a database defaulting to it)
-- did not see the first one's row and made a second: every row sent twice
-- (outside probe, 10 of 10 tries); and ferry.backfill_resume of a failed one
-- did not look at all. A unique index holds whatever the snapshot.
--
-- Existing pairs (made before this check) keep the oldest active one; the
-- others are marked failed, saying why, and may be resumed once it is done
-- or cancelled.

update ferry.backfills b
set state = 'failed', updated_at = now(),
    reason = format('pgferry 0041: backfill %s of the same table for the same readers was active too (each row '
                    'went to them twice); resume this one once that one is done or cancelled', o.id)
from (select min(x.id) as id, x.relid, x.target from ferry.backfills x
      where x.state in ('running', 'paused') group by x.relid, x.target having count(*) > 1) o
where b.relid = o.relid and b.target is not distinct from o.target and b.id <> o.id
  and b.state in ('running', 'paused');

create unique index backfills_one_active_idx on ferry.backfills (relid, coalesce(target, ''))
    where state in ('running', 'paused');
