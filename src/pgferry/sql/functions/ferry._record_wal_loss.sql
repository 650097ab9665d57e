-- ferry._record_wal_loss(problem text, to_lsn pg_lsn default null) returns text
--
-- Records that WAL capture lost changes (migration 0025): its slot was
-- invalidated (max_slot_wal_keep_size) or dropped, or ferry.reset_wal_slot
-- replaced it, so the changes committed after ferry.wal_slot.lsn and before
-- the new slot never reach the log. Writes a gap (ferry.gaps, cause 'wal
-- slot lost', from_lsn the position the log is complete up to) for each
-- consumer whose streams a WAL capture of that range writes to (every
-- partition of a subscription; not those draining after a change of
-- partitions), unless it has an open one already.
-- problem: what happened, in words ("PostgreSQL invalidated the
-- replication slot ..."). to_lsn NULL (the relay found the slot lost): the
-- gaps stay open (to_lsn NULL) and ferry.wal_slot is marked (invalidated_at,
-- note). to_lsn given (ferry._ensure_wal_slot resetting, the new slot's
-- position): the open gaps are closed there (to_lsn, to_tick,
-- newest_event_at, reason), and consumers without one get a closed gap (a
-- slot reset before any relay saw it lost, or a healthy slot reset with the
-- relays stopped). No consumer is stalled and no cursor moves: the log
-- itself misses the changes. Returns the reason written, with the
-- operator's way out (NULL when nothing is captured from the WAL).
--
-- Calls:   -
-- Reads:   ferry.captures, ferry.consumers, ferry.ticks, ferry.wal_slot
-- Writes:  ferry.gaps, ferry.wal_slot
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay; capture/wal.py), ferry._ensure_wal_slot

create or replace function ferry._record_wal_loss(problem text, to_lsn pg_lsn default null) returns text
language plpgsql as $$
declare
    w ferry.wal_slot;
    v_reason text;
    v_newest bigint;
    v_from_tick bigint;
begin
    select * into w from ferry.wal_slot for update;
    if not found then
        return null;
    end if;
    if to_lsn is null then
        v_reason := format('%s: changes committed after %s are not in the log (a gap of each consumer reading them, '
                           'ferry.gaps). Run select ferry.reset_wal_slot(); then `pgferry backfill` each table '
                           'captured with method ''wal''', problem, w.lsn);
        update ferry.wal_slot set invalidated_at = coalesce(invalidated_at, now()), note = v_reason;
    else
        v_reason := format('%s: changes committed after %s and before %s are not in the log (reset at %s); '
                           '`pgferry backfill` each table captured with method ''wal'' to send its current rows',
                           problem, w.lsn, to_lsn, to_char(now(), 'YYYY-MM-DD HH24:MI:SSOF'));
    end if;
    -- the log's ticks around the hole: when capture last appended, and now
    select max(t.id) into v_newest from ferry.ticks t;
    select max(t.id) into v_from_tick from ferry.ticks t where t.created_at <= w.caught_up_at;
    v_from_tick := least(coalesce(v_from_tick, (select min(t.id) from ferry.ticks t)), v_newest);
    if to_lsn is not null then
        update ferry.gaps g
        set to_lsn = _record_wal_loss.to_lsn, to_tick = greatest(g.to_tick, v_newest), newest_event_at = now(),
            reason = v_reason, updated_at = now()
        where g.cause = 'wal slot lost' and g.to_lsn is null;
    end if;
    insert into ferry.gaps (consumer, subscription, from_tick, to_tick, events, from_lsn, to_lsn, oldest_event_at,
                            newest_event_at, cause, reason)
    select c.name, c.subscription, v_from_tick, v_newest, null, w.lsn, _record_wal_loss.to_lsn, w.committed_at,
           case when _record_wal_loss.to_lsn is not null then now() end, 'wal slot lost', v_reason
    from ferry.consumers c
    where c.drain_to is null
      and exists (select 1 from ferry.captures k
                  where k.method = 'wal' and (c.streams is null or k.stream = any (c.streams))
                    and (k.uncaptured_at is null or k.uncaptured_lsn > w.lsn)
                    and (_record_wal_loss.to_lsn is null or k.captured_lsn is null
                         or k.captured_lsn < _record_wal_loss.to_lsn))
      -- one gap per loss: an open one, or the one just closed
      and not exists (select 1 from ferry.gaps g
                      where g.consumer = c.name and g.cause = 'wal slot lost'
                        and (g.to_lsn is null or (g.from_lsn = w.lsn and g.to_lsn = _record_wal_loss.to_lsn)));
    return v_reason;
end $$;
