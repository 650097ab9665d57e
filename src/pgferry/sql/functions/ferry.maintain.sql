-- ferry.maintain() returns text[]
--
-- Retention: rotate partitions and truncate the ones every consumer passed
--
-- One maintenance step; the elected relay calls it every few seconds.
-- Returns what it did, for the relay's log.
--
-- Calls:   ferry._current_partition
-- Reads:   ferry.config, ferry.consumers, ferry.events
-- Writes:  ferry.partitions, ferry.ticks
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.maintain() returns text[]
language plpgsql as $$
declare
    cur ferry.partitions;
    nxt ferry.partitions;
    p ferry.partitions;
    v_done text[] := '{}';
    v_min_xmin xid8;
    v_keep_tick bigint;
begin
    -- The pointer is non-transactional; if an earlier call failed after moving
    -- it, point it back at the partition the table calls current.
    select * into cur from ferry.partitions where state = 'current';
    if ferry._current_partition() <> cur.part then
        perform setval('ferry.current_partition_seq', cur.part);
    end if;

    -- Step 2 of a rotation: this transaction started after the pointer moved,
    -- so its own txid is above that of every transaction that wrote into the
    -- partition being closed (a snapshot's xmax would not be: the newest
    -- running transaction is at or above it).
    update ferry.partitions set state = 'closed', closed_xmax = pg_current_xact_id()
    where state = 'closing' returning * into p;
    if found then
        v_done := v_done || format('partition %s closed', p.part);
    end if;

    -- Truncate closed partitions that every consumer (or, with no consumer,
    -- the newest tick) has passed, and that stopped taking writes at least
    -- rotation_interval ago: stream readers hold no cursor, so without that
    -- floor an event written just before a rotation could be dropped seconds
    -- later, under a reader that merely reconnected. Every event stays
    -- readable for at least rotation_interval (at most about twice that).
    select min(pg_snapshot_xmin(t.snapshot)) into v_min_xmin
    from ferry.consumers c join ferry.ticks t on t.id = c.tick_id;
    if v_min_xmin is null then
        select pg_snapshot_xmin(t.snapshot) into v_min_xmin from ferry.ticks t order by id desc limit 1;
    end if;
    for p in select * from ferry.partitions
             where state = 'closed' and closed_xmax <= v_min_xmin
               and closed_at <= now() - (select rotation_interval from ferry.config) loop
        begin
            perform set_config('lock_timeout', '200ms', true);
            execute format('truncate ferry.events_%s', p.part);
            perform set_config('lock_timeout', '0', true);
            update ferry.partitions set state = 'empty', opened_at = null, open_tick = null, closed_at = null, closed_xmax = null
            where part = p.part;
            v_done := v_done || format('partition %s truncated', p.part);
        exception when lock_not_available then
            v_done := v_done || format('partition %s busy, truncate later', p.part);
        end;
    end loop;

    -- Ticks older than every consumer's cursor and every retained partition's
    -- start are no longer needed.
    select least((select min(c.tick_id) from ferry.consumers c),
                 (select min(p2.open_tick) from ferry.partitions p2 where p2.state <> 'empty'),
                 (select max(t.id) from ferry.ticks t))
    into v_keep_tick;
    delete from ferry.ticks where id < v_keep_tick;
    -- Step 1 of a rotation: move writers to the next partition when the current
    -- one is old enough, holds events, and the next one is empty.
    select * into cur from ferry.partitions where state = 'current';
    select * into nxt from ferry.partitions where part = (cur.part + 1) % 3;
    if nxt.state = 'empty' and cur.opened_at < now() - (select rotation_interval from ferry.config)
       and exists (select 1 from ferry.events e where e.part = cur.part) then
        update ferry.partitions set state = 'current', opened_at = now(),
               open_tick = (select max(id) from ferry.ticks) where part = nxt.part;
        update ferry.partitions set state = 'closing', closed_at = now() where part = cur.part;
        perform setval('ferry.current_partition_seq', nxt.part);
        v_done := v_done || format('writers moved to partition %s', nxt.part);
    end if;

    return v_done;
end $$;
