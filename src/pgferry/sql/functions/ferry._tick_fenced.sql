-- ferry._tick_fenced(force boolean, fence pg_snapshot, fence_lsn pg_lsn, fence_tick bigint, fence_at timestamptz, behind_lsn pg_lsn, out tick_id bigint, out idle boolean, out waiting boolean, out written boolean, out next_fence pg_snapshot, out next_lsn pg_lsn, out next_tick bigint, out next_at timestamptz, out next_behind pg_lsn) returns record
--
-- The relay's ticker: ferry._tick, except that while WAL capture runs, a
-- tick is recorded only once WAL capture has appended every transaction its
-- snapshot sees committed, so that WAL-captured events are in the batch of
-- their transaction's commit like every other event (migration 0028).
--
-- A fence is a snapshot with the WAL insert position taken with it
-- (ferry._wal_insert_position): every transaction the snapshot sees
-- committed has its commit record before that position. The caller keeps
-- the fence this returns (next_*) and passes it back (fence*) on its next
-- call; the fence's tick is recorded when the slot's confirmed position
-- reaches fence_lsn (the relay confirms only what it has appended and
-- committed: capture/wal.py). A fence is taken again, not kept, when a tick
-- was recorded since it was (fence_tick is not the newest tick: someone
-- called ferry.tick()), so tick ids follow snapshot order, and when it does
-- not see ferry.wal_slot.late_txid committed (migration 0030: a round of WAL
-- capture moved changes to a later batch after the fence was taken; the
-- fence sees later source transactions committed but not that round, and
-- would put their changes first). The next fence
-- is taken before this call records its tick, whose WAL the slot need not
-- read first.
--
-- Waiting is bounded. A fence not reached within config.wal_order_wait of
-- fence_at is recorded as it is, and WAL capture is then behind: until the
-- slot is confirmed past where the WAL was at that moment (behind_lsn,
-- passed back like the fence), ticks take the snapshot of now and wait for
-- nothing, so a decoder that lags (a large transaction, too little CPU)
-- costs every other event one wait, not one per tick. Without a WAL capture
-- to wait for (none, nobody streaming the slot, WAL capture failing, the
-- slot lost, wal_order_wait 0) or with force, it is ferry._tick: the
-- snapshot of now, next_* NULL. A change whose transaction a tick recorded
-- without it sees committed comes in a later batch (ferry._append_wal_v2).
--
-- Returns one row: the tick recorded (tick_id NULL when none) and whether
-- it was idle, as ferry._tick; waiting: a fence is pending; written: while
-- waiting, events were written since the newest tick (look again soon; a
-- fence waits for the cluster's WAL, which other databases move too);
-- next_*: the fence and the catch-up position to pass next time.
--
-- Calls:   ferry._tick_snapshot, ferry._wal_insert_position, ferry._written_since
-- Reads:   ferry.captures, ferry.config, ferry.event_id_seq, ferry.ticks, ferry.wal_slot, pg_replication_slots
-- Writes:  ferry.ticks
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay)

create or replace function ferry._tick_fenced(
    force boolean, fence pg_snapshot, fence_lsn pg_lsn, fence_tick bigint, fence_at timestamptz, behind_lsn pg_lsn,
    out tick_id bigint, out idle boolean, out waiting boolean, out written boolean,
    out next_fence pg_snapshot, out next_lsn pg_lsn, out next_tick bigint, out next_at timestamptz,
    out next_behind pg_lsn)
returns record language plpgsql as $$
declare
    v_wait      interval;
    v_confirmed pg_lsn;
    v_last      bigint;
    v_snap      pg_snapshot;
begin
    perform pg_advisory_xact_lock(28774, 4);  -- ferry._tick's
    waiting := false;
    written := false;
    select c.wal_order_wait into v_wait from ferry.config c;
    select s.confirmed_flush_lsn into v_confirmed
    from ferry.wal_slot w join pg_replication_slots s on s.slot_name = w.slot_name
    where s.active and w.error is null and w.invalidated_at is null
      and exists (select 1 from ferry.captures c where c.method = 'wal' and c.uncaptured_at is null);
    if v_confirmed < behind_lsn then
        next_behind := behind_lsn;  -- still catching up: wait for nothing
    end if;
    if force or v_confirmed is null or v_wait <= interval '0' or next_behind is not null then
        select t.tick_id, t.idle into tick_id, idle from ferry._tick_snapshot(force, pg_current_snapshot()) t;
        return;
    end if;
    select max(t.id) into v_last from ferry.ticks t;
    if fence is not null and fence_tick = v_last
       and not exists (select 1 from ferry.wal_slot w
                       where w.late_txid is not null and not pg_visible_in_snapshot(w.late_txid, fence)) then
        if v_confirmed < fence_lsn and clock_timestamp() < fence_at + v_wait then
            -- Not appended yet: keep the fence, record nothing.
            select true, fence, fence_lsn, fence_tick, fence_at into waiting, next_fence, next_lsn, next_tick, next_at;
            written := ferry._written_since(v_last);
            return;
        end if;
        v_snap := fence;
    end if;
    select pg_current_snapshot(), ferry._wal_insert_position(), clock_timestamp()
    into next_fence, next_lsn, next_at;
    if v_snap is not null and v_confirmed < fence_lsn then
        -- The wait ran out: WAL capture is behind until it reaches where the WAL is now.
        next_behind := next_lsn;
        select null, null, null into next_fence, next_lsn, next_at;
    elsif v_snap is null and v_confirmed >= next_lsn then
        -- Nothing written since WAL capture's last confirmation: no need to wait.
        v_snap := next_fence;
        select null, null, null into next_fence, next_lsn, next_at;
    end if;
    if v_snap is not null then
        select t.tick_id, t.idle into tick_id, idle from ferry._tick_snapshot(false, v_snap) t;
    end if;
    next_tick := coalesce(tick_id, v_last);
    waiting := next_fence is not null;
    written := waiting and ferry._written_since(next_tick);
end $$;
