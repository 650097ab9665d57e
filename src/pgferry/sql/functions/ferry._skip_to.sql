-- ferry._skip_to(p_consumer text, p_to_tick bigint, p_part smallint, p_cause text, p_reason text) returns bigint
--
-- Moves a consumer's cursor forward to p_to_tick and records in ferry.gaps
-- the events of its streams it had not read and will now never get
-- (migration 0014). p_part given: the events of that partition not visible
-- in the cursor's snapshot, counted just before ferry.maintain truncates it
-- (the new cursor is the oldest tick left, so nothing else is skipped).
-- p_part NULL: the events committed between the cursor and p_to_tick (an
-- operator's resume from now). A gap of cause 'retention' that ends where
-- the cursor stands (nothing read since) is extended instead of adding a
-- row, so a consumer nobody reads keeps one gap per stall. Nothing is
-- recorded when nothing is skipped. A 'retention' gap sets the consumer's
-- subscription to 'stalled' (any of its partitions' gaps): relays stop delivering it until
-- it is resumed. A partition draining after a change of partitions counts
-- only the events up to its drain_to tick: those after it are the new
-- partitions' (each counts its own). Any open batch is dropped. Returns the
-- events skipped. When it skipped any, it notifies channel pgferry_moved
-- with the consumer's name: the relay delivering it stops sending what it
-- read before, now a gap, instead of finishing its round (relay/ownership.py).
--
-- Calls:   ferry._partition_of
-- Reads:   ferry.events, ferry.ticks
-- Writes:  ferry.consumers, ferry.gaps, ferry.subscriptions
-- Raises:  42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._skip_to(p_consumer text, p_to_tick bigint, p_part smallint, p_cause text, p_reason text)
returns bigint language plpgsql as $$
declare
    c ferry.consumers;
    v_from pg_snapshot;
    v_to pg_snapshot;
    v_drain pg_snapshot;
    v_new bigint;
    v_n bigint;
    v_first bigint;
    v_last bigint;
    v_oldest timestamptz;
    v_newest timestamptz;
    v_sub text;
    v_gap ferry.gaps;
begin
    select * into c from ferry.consumers where name = p_consumer for update;
    if not found then
        raise exception 'pgferry: consumer % does not exist', quote_literal(p_consumer) using errcode = '42704';
    end if;
    v_new := greatest(c.tick_id, p_to_tick);
    select t.snapshot into v_from from ferry.ticks t where t.id = c.tick_id;
    select t.snapshot into v_to from ferry.ticks t where t.id = v_new;
    select t.snapshot into v_drain from ferry.ticks t where t.id = c.drain_to;
    select count(*), min(e.id), max(e.id), min(e.created_at), max(e.created_at)
    into v_n, v_first, v_last, v_oldest, v_newest
    from ferry.events e
    where (p_part is null or e.part = p_part)
      and (c.streams is null or e.stream = any (c.streams))
      and (e.target is null or e.target = coalesce('webhook:' || c.subscription, p_consumer))
      and (c.parts <= 1 or ferry._partition_of(e.key, e.id, c.parts) = c.part)
      and not pg_visible_in_snapshot(e.txid, v_from)
      and (c.drain_to is null or pg_visible_in_snapshot(e.txid, v_drain))
      and (p_part is not null or pg_visible_in_snapshot(e.txid, v_to));
    v_sub := c.subscription;
    if v_n > 0 then
        select * into v_gap from ferry.gaps g
        where g.consumer = p_consumer and g.cause = p_cause and p_cause = 'retention' and g.to_tick = c.tick_id
        order by g.id desc limit 1;
        if found then
            update ferry.gaps g set to_tick = v_new, events = g.events + v_n,
                   first_event_id = least(g.first_event_id, v_first), last_event_id = greatest(g.last_event_id, v_last),
                   oldest_event_at = least(g.oldest_event_at, v_oldest), newest_event_at = greatest(g.newest_event_at, v_newest),
                   reason = p_reason, updated_at = now()
            where g.id = v_gap.id returning * into v_gap;
        else
            insert into ferry.gaps (consumer, subscription, from_tick, to_tick, events, first_event_id, last_event_id,
                                    oldest_event_at, newest_event_at, cause, reason)
            values (p_consumer, v_sub, c.tick_id, v_new, v_n, v_first, v_last, v_oldest, v_newest, p_cause, p_reason)
            returning * into v_gap;
        end if;
        if v_sub is not null and p_cause = 'retention' then
            update ferry.subscriptions s set state = 'stalled', updated_at = now(),
                   state_reason = format('retention dropped %s event(s) it had not delivered (%s); resume it with '
                                         '`pgferry subscription resume %s --from retained` (or --from now)',
                                         -- this gap, and the open gaps of the subscription's other
                                         -- partitions (each partition wrote its own count here)
                                         v_gap.events + coalesce((
                                             select sum(g.events) from ferry.gaps g
                                             join ferry.consumers cc on cc.name = g.consumer
                                             where cc.subscription = v_sub and cc.name <> p_consumer
                                               and g.cause = 'retention' and g.to_tick = cc.tick_id), 0),
                                         p_reason, v_sub)
                                  -- a pause stalled away was lost without a word (outside probe)
                                  || case when s.state = 'paused' or (s.state = 'stalled' and s.state_reason like '%it was paused%')
                                          then '; it was paused: resuming makes it deliver, so pause it again after '
                                               'resuming to keep it paused'
                                          else '' end
            where s.name = v_sub;
        end if;
    end if;
    update ferry.consumers set tick_id = v_new, next_tick_id = null, batch_id = null, updated_at = now()
    where name = p_consumer;
    if v_n > 0 then
        perform pg_notify('pgferry_moved', p_consumer);
    end if;
    return v_n;
end $$;
