-- ferry.maintain() returns text[]
--
-- Retention: rotate partitions and truncate the ones every consumer passed,
-- within the retention limit (migration 0014)
--
-- One maintenance step; the elected relay calls it every few seconds.
-- Returns what it did, for the relay's log: lines starting with
-- "warning:" (a consumer crossed 50% or 80% of the limit), "stalled:" (it
-- went over and no longer holds the log back) and "gap:" (retention dropped
-- events a stalled consumer had not read) are logged as warnings.
--
-- The limit: a consumer whose cursor is older than config.max_retention, or
-- that holds back the oldest closed partition while the log is larger than
-- config.max_retention_bytes, is marked stalled and stops holding truncation
-- back; one that gets back under half the limit before anything was skipped is
-- unmarked. When a partition a stalled consumer had not passed is truncated,
-- ferry._skip_to records its gap and moves its cursor to the oldest tick
-- left, in the same transaction.
--
-- Calls:   ferry._current_partition, ferry._skip_to, ferry.retention_status
-- Reads:   ferry.config, ferry.consumers, ferry.events, ferry.gaps
-- Writes:  ferry.consumers, ferry.gaps, ferry.partitions, ferry.subscriptions, ferry.ticks
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
    cfg ferry.config;
    r record;
    v_level smallint;
    v_to bigint;
    v_n bigint;
    v_log_bytes bigint;
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

    -- The retention limit. Warnings when a consumer crosses 50% or 80% of it
    -- (once per crossing: consumers.retention_level remembers the last one
    -- said), stalled past it, unmarked when back within it with nothing
    -- skipped yet.
    select * into cfg from ferry.config;
    for r in select * from ferry.retention_status() loop
        v_log_bytes := r.log_bytes;
        if r.stalled_at is null and r.time_pct > 100 then
            update ferry.consumers set stalled_at = now(), retention_level = 100,
                   stalled_reason = format('stalled at %s: its cursor was %s old, over max_retention %s',
                                           to_char(now(), 'YYYY-MM-DD HH24:MI:SSOF'),
                                           justify_interval(make_interval(secs => round(r.lag_seconds))), cfg.max_retention)
            where name = r.consumer;
            v_done := v_done || format('stalled: consumer %s is over the retention limit (cursor %s old, max_retention %s) '
                                       'and no longer holds the log back; what retention drops before it reads it '
                                       'will be recorded as a gap', r.consumer,
                                       justify_interval(make_interval(secs => round(r.lag_seconds))), cfg.max_retention);
        elsif r.stalled_at is null then
            v_level := case r.level when '80%' then 80 when '50%' then 50 else 0 end;
            if v_level > (select c.retention_level from ferry.consumers c where c.name = r.consumer) then
                v_done := v_done || format('warning: consumer %s holds the log back: cursor %s old (%s%% of max_retention %s), '
                                           'holds %s%s', r.consumer,
                                           justify_interval(make_interval(secs => round(r.lag_seconds))),
                                           round(r.time_pct::numeric), cfg.max_retention, pg_size_pretty(r.held_bytes),
                                           case when cfg.max_retention_bytes is null then ''
                                                else format(' (log %s, %s%% of max_retention_bytes %s)',
                                                            pg_size_pretty(r.log_bytes), round(r.size_pct::numeric),
                                                            pg_size_pretty(cfg.max_retention_bytes)) end);
            elsif v_level = 0 and (select c.retention_level from ferry.consumers c where c.name = r.consumer) > 0 then
                v_done := v_done || format('consumer %s is back under 50%% of the retention limit', r.consumer);
            end if;
            update ferry.consumers c set retention_level = v_level where c.name = r.consumer and c.retention_level <> v_level;
        -- Back only under half the limit: a consumer that reads nothing (a stream nobody writes)
        -- moved by a truncation to the oldest tick left, near the limit while another consumer
        -- holds the log, was unmarked and stalled again every few seconds, a warning each time
        -- (outside probe).
        elsif r.time_pct < 50
              and (cfg.max_retention_bytes is null or r.log_bytes <= cfg.max_retention_bytes or r.held_bytes = 0)
              and not exists (select 1 from ferry.gaps g where g.consumer = r.consumer and g.updated_at >= r.stalled_at
                                and g.moved_cursor) then
            update ferry.consumers set stalled_at = null, stalled_reason = null, retention_level = 0 where name = r.consumer;
            v_done := v_done || format('consumer %s is back within the retention limit before anything was skipped', r.consumer);
        end if;
    end loop;
    -- Over the size cap: the consumers holding back the oldest closed
    -- partition that may go (rotation_interval after it closed) are stalled,
    -- so that it can be truncated.
    if cfg.max_retention_bytes is not null and v_log_bytes > cfg.max_retention_bytes then
        for r in select c.name, p2.part from ferry.consumers c join ferry.ticks t on t.id = c.tick_id,
                 (select * from ferry.partitions pp where pp.state = 'closed' and pp.closed_at <= now() - cfg.rotation_interval
                    and pp.closed_xmax < pg_current_xact_id()  -- closed by an earlier call: readers had a round to pass it
                  order by pp.closed_at limit 1) p2
                 where c.stalled_at is null and pg_snapshot_xmin(t.snapshot) < p2.closed_xmax loop
            update ferry.consumers set stalled_at = now(), retention_level = 100,
                   stalled_reason = format('stalled at %s: the log (%s) was over max_retention_bytes (%s) and it held partition %s back',
                                           to_char(now(), 'YYYY-MM-DD HH24:MI:SSOF'), pg_size_pretty(v_log_bytes),
                                           pg_size_pretty(cfg.max_retention_bytes), r.part)
            where name = r.name;
            v_done := v_done || format('stalled: consumer %s holds partition %s back while the log (%s) is over '
                                       'max_retention_bytes (%s); it no longer holds the log back, and what retention '
                                       'drops before it reads it will be recorded as a gap', r.name, r.part,
                                       pg_size_pretty(v_log_bytes), pg_size_pretty(cfg.max_retention_bytes));
        end loop;
    end if;

    -- Truncate closed partitions that every consumer (or, with no consumer,
    -- the newest tick) has passed, and that stopped taking writes at least
    -- rotation_interval ago: stream readers hold no cursor, so without that
    -- floor an event written just before a rotation could be dropped seconds
    -- later, under a reader that merely reconnected. Every event stays
    -- readable for at least rotation_interval (at most about twice that).
    -- Stalled consumers do not count: what they had not read is recorded as
    -- their gap just before the truncate, and their cursor moved past it.
    select min(pg_snapshot_xmin(t.snapshot)) into v_min_xmin
    from ferry.consumers c join ferry.ticks t on t.id = c.tick_id where c.stalled_at is null;
    if v_min_xmin is null then
        select pg_snapshot_xmin(t.snapshot) into v_min_xmin from ferry.ticks t order by id desc limit 1;
    end if;
    -- Oldest first: a gap's cursor moves to the oldest tick of the partitions left, and with a
    -- newer one truncated first that was the older one's, about to go (gaps from tick N to N;
    -- outside probe).
    for p in select * from ferry.partitions
             where state = 'closed' and closed_xmax <= v_min_xmin
               and closed_at <= now() - (select rotation_interval from ferry.config)
             order by closed_at, part loop
        begin
            perform set_config('lock_timeout', '200ms', true);
            select min(p2.open_tick) into v_to from ferry.partitions p2 where p2.state <> 'empty' and p2.part <> p.part;
            for r in select c.name, c.tick_id, c.stalled_reason from ferry.consumers c join ferry.ticks t on t.id = c.tick_id
                     where c.stalled_at is not null and pg_snapshot_xmin(t.snapshot) < p.closed_xmax order by c.name loop
                v_n := ferry._skip_to(r.name, v_to, p.part, 'retention', r.stalled_reason);
                if v_n > 0 then
                    v_done := v_done || format('gap: consumer %s (stalled) never gets %s event(s) of partition %s, truncated '
                                               'under it; its cursor moved from tick %s to %s (ferry.gaps)',
                                               r.name, v_n, p.part, r.tick_id, greatest(r.tick_id, v_to));
                end if;
            end loop;
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
