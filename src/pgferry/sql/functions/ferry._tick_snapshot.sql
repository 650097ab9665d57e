-- ferry._tick_snapshot(force boolean, snap pg_snapshot, out tick_id bigint, out idle boolean) returns setof record
--
-- Records a tick with snapshot snap when something committed since the last
-- tick (or when forced, or when the last tick is older than
-- idle_tick_interval), and sends one NOTIFY for it. Returns the new tick id
-- and whether it was only an idle tick, or no row. The caller holds
-- ferry._tick's lock (advisory 28774/4) and took snap after the last tick's:
-- tick ids must follow snapshot order. ferry._tick passes the snapshot of
-- now, ferry._tick_fenced one taken earlier (a fence, migration 0028).
--
-- Calls:   -
-- Reads:   ferry.config, ferry.event_id_seq, ferry.events, ferry.ticks
-- Writes:  ferry.ticks
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER), with enable_seqscan off: its plans
--          are cached in the ticker's session, and one made while a partition
--          of the log was empty (after a truncate or a rotation) scanned it whole
--          once it was full: 110 ms a call with 300,000 events retained, on
--          every round of the ticker with nothing new, until something made the
--          session plan again. And jit off: pgferry's sessions have it off
--          (db.SESSION_DEFAULTS), but ferry.tick() is anyone's to call, and in
--          psql, with seq scans costed as disabled, the scans of the sequence and
--          of ferry.config were compiled (200 ms a call).
-- Callers: PUBLIC (the default)

create or replace function ferry._tick_snapshot(force boolean, snap pg_snapshot, out tick_id bigint, out idle boolean)
returns setof record language plpgsql set enable_seqscan = off set jit = off as $$
declare
    v_last ferry.ticks;
    v_seq  bigint;
    v_new  boolean;
begin
    -- Something may have committed since the last tick when: the event counter
    -- moved; or a transaction the last tick listed as in progress committed
    -- with events; or an event of a transaction at or above the last tick's
    -- xmax became visible (the newest running transaction is not listed in
    -- xip, yet its events may already be counted in event_seq). Events that
    -- committed after snap make a tick whose batch is empty: harmless.
    select case when is_called then last_value else 0 end into v_seq from ferry.event_id_seq;
    select * into v_last from ferry.ticks order by id desc limit 1;
    v_new := v_last.id is null or v_seq <> v_last.event_seq
        or exists (
           select 1 from pg_snapshot_xip(v_last.snapshot) x
           where pg_xact_status(x) = 'committed' and exists (select 1 from ferry.events e where e.txid = x))
        or exists (
           select 1 from ferry.events e where e.txid >= pg_snapshot_xmax(v_last.snapshot));
    if not (v_new or force or v_last.created_at <= now() - (select idle_tick_interval from ferry.config)) then
        return;
    end if;
    insert into ferry.ticks (id, snapshot, event_seq)
    values (nextval('ferry.tick_id_seq'), snap, v_seq)
    returning id into tick_id;
    perform pg_notify('pgferry_tick', tick_id::text);
    idle := not v_new;
    return next;
end $$;
