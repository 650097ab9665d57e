-- ferry._catalog_streams() returns integer
--
-- Adds to ferry.streams the streams of the events committed since the
-- snapshot in ferry.stream_scan, and moves that snapshot to the newest
-- tick's. So each call catalogues exactly the events committed in the ticks
-- (scanned_tick, newest], and a stream first seen by it has every event
-- committed after the previous scanned_tick: that is its first_tick, where
-- a stream reader starting from the beginning begins (0010). Reads the
-- log like ferry.batch_events: the txid range between the two snapshots'
-- xmax plus the transactions the older one listed as in progress, never from
-- its xmin, so one long transaction cannot make every call slow; the range is
-- bounded on both sides so the txid index stays the plan without statistics
-- (see 0007). Concurrent calls take turns (row lock on ferry.stream_scan).
--
-- Parameters: none.
-- Returns:    the number of streams added.
-- Calls:      nothing.
-- Tables:     reads ferry.events, ferry.ticks; writes ferry.streams, ferry.stream_scan.
-- Raises:     nothing of its own (42501 without privileges on those tables).
-- Roles:      ferry_relay, through ferry.housekeeping.
-- Settings:   enable_seqscan and jit off, as ferry._tick_snapshot: its plans are
--             cached in the relay's session, and one made while a partition was
--             empty scanned it whole.

create or replace function ferry._catalog_streams() returns integer
language plpgsql set enable_seqscan = off set jit = off as $$
declare
    v_from      pg_snapshot;
    v_from_tick bigint;
    v_to        pg_snapshot;
    v_to_tick   bigint;
    n           integer;
begin
    select s.scanned_to, s.scanned_tick into v_from, v_from_tick from ferry.stream_scan s for update;
    select t.id, t.snapshot into v_to_tick, v_to from ferry.ticks t order by t.id desc limit 1;
    if v_to_tick is null or v_to_tick <= coalesce(v_from_tick, 0) then
        return 0;  -- no new tick since the last call
    end if;
    -- Before 0010 the snapshot was not a tick's (scanned_tick is NULL): streams first seen now get
    -- no first_tick (their readers start at the oldest retained tick), and later ones do.
    insert into ferry.streams as k (stream, first_event_at, first_tick)
    select x.stream, min(x.created_at), v_from_tick
    from (select e.stream, e.created_at from ferry.events e
          where e.txid >= pg_snapshot_xmax(v_from) and e.txid < pg_snapshot_xmax(v_to)
            and pg_visible_in_snapshot(e.txid, v_to)
          union all
          select e.stream, e.created_at from ferry.events e
          where e.txid = any (array(select pg_snapshot_xip(v_from)))
            and e.txid >= pg_snapshot_xmin(v_from) and e.txid < pg_snapshot_xmax(v_from)
            and pg_visible_in_snapshot(e.txid, v_to)) x
    group by x.stream
    on conflict (stream) do nothing;
    get diagnostics n = row_count;
    update ferry.stream_scan set scanned_to = v_to, scanned_tick = v_to_tick, scanned_at = now();
    return n;
end $$;

grant execute on function ferry._catalog_streams() to ferry_relay;
