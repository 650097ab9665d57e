-- ferry.after_promotion(force boolean default false, out old_timeline bigint, out new_timeline bigint, out step bigint, out last_event_id bigint, out next_event_id bigint, out old_instance text, out new_instance text) returns setof record
--
-- After a failover or a restore: makes sure no event, tick or batch gets an
-- id that the lost history may already have given to a receiver (migration
-- 0039). A standby promoted, or a backup restored to a point in time, goes
-- on from the ids it had replayed; the old primary may have handed out and
-- delivered ids beyond them, whose events are lost with it. When the
-- server's WAL timeline is not the one ferry.config.timeline recorded (or
-- with force), this moves ferry.event_id_seq, ferry.tick_id_seq and
-- ferry.batch_id_seq (ids receivers hold: webhook-ids and broker duplicate
-- keys, stream offsets, readers' batches) on by step, and the ticks'
-- event_seq with them (batch sizes and lag are differences of those), gives
-- the install a new instance name (the brokers' duplicate keys), records
-- the timeline and takes a tick. Returns one row saying what it did, or
-- none when the timeline is the recorded one (or the server is a standby:
-- nothing can be written there; with force that is an error, 25006).
--
-- step = 2^32 + 2^24 x the seconds since the newest tick replayed here:
-- the lost history can only have handed out ids after that tick (and
-- ferry.tick_id_seq and ferry.batch_id_seq no faster than event ids), and
-- one uncached sequence hands out far fewer than 2^24 (16.7 million) a
-- second (about 2.4 million in a loop of nextval alone on the development
-- machine; an event costs much more). 2^32 covers clocks that disagree by
-- minutes. The seconds count at most 10^9. Ids stay under 2^53 (exact in
-- JavaScript, where receivers read data[].id) for about 17 years of such
-- seconds in all.
--
-- The relay calls it before its ticker's first tick and every few seconds
-- (log/timeline.py), and when it connects its ownership connection; an
-- operator calls it right after a promotion, before writers are let in
-- (events written before it ran re-use ids), and with force after a restore
-- that keeps the timeline (a base backup started without recovery, a dump):
-- docs/operations.md, "Failover and restore".
--
-- Calls:   ferry._tick_snapshot
-- Reads:   ferry.batch_id_seq, ferry.config, ferry.event_id_seq, ferry.tick_id_seq, ferry.ticks
-- Writes:  ferry.batch_id_seq, ferry.config, ferry.event_id_seq, ferry.tick_id_seq, ferry.ticks
-- Raises:  25006
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default); the relay and the operator

create or replace function ferry.after_promotion(
    force boolean default false,
    out old_timeline bigint, out new_timeline bigint, out step bigint,
    out last_event_id bigint, out next_event_id bigint, out old_instance text, out new_instance text)
returns setof record language plpgsql as $$
declare
    v_newest timestamptz;
    v_seconds bigint;
begin
    if pg_is_in_recovery() then
        if force then
            raise exception 'pgferry: this server is a standby: promote it first' using errcode = '25006',
                hint = 'Run ferry.after_promotion() on the promoted server, before writers are let in.';
        end if;
        return;
    end if;
    -- The timeline WAL is written on now (pg_control_checkpoint() says it only after the next checkpoint).
    new_timeline := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    select c.timeline into old_timeline from ferry.config c;
    if not force and old_timeline = new_timeline then
        return;
    end if;
    -- Once, and with no tick meanwhile (ferry._tick's lock): ticks read the sequence and event_seq.
    perform pg_advisory_xact_lock(28774, 4);
    select c.timeline, c.instance into old_timeline, old_instance from ferry.config c for update;
    if not force and old_timeline = new_timeline then
        return;  -- another session did it meanwhile
    end if;
    if old_timeline is null and not force then
        update ferry.config set timeline = new_timeline;  -- nothing to compare with: only record it
        return;
    end if;
    select t.created_at into v_newest from ferry.ticks t order by t.id desc limit 1;
    v_seconds := least(ceil(greatest(0, extract(epoch from now() - coalesce(v_newest, now())))), 1000000000);
    step := 4294967296 + 16777216 * v_seconds;
    select case when s.is_called then s.last_value else 0 end into last_event_id from ferry.event_id_seq s;
    perform setval('ferry.event_id_seq', last_event_id + step);
    perform setval('ferry.tick_id_seq', (select s.last_value from ferry.tick_id_seq s) + step);
    perform setval('ferry.batch_id_seq',
                   (select case when s.is_called then s.last_value else 0 end from ferry.batch_id_seq s) + step);
    update ferry.ticks set event_seq = event_seq + step;
    update ferry.config set timeline = new_timeline, instance = default returning instance into new_instance;
    -- A tick past the jump: offsets a reader was given in the lost history are behind the log now.
    perform ferry._tick_snapshot(true, pg_current_snapshot());
    next_event_id := last_event_id + step + 1;
    return next;
end $$;
