-- ferry.webhook_steps( subscriptions text[], consumers text[], epochs bigint[], ordered boolean[], ack_from bigint[], ack_to bigint[], peeks boolean[], peek_after bigint[], attempt_req integer[], event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[], max_events integer) returns table (reqs integer[], refused text, start_tick bigint, end_tick bigint, more boolean, id bigint, stream text, key text, payload text, headers text, created_at timestamptz, blocked boolean)
--
-- ferry.webhook_step for many subscriptions in one round trip: a relay with
-- 1,000 subscriptions on one stream makes one statement per tick, not 1,000,
-- and reads the tick's events once. Request i is the i-th element of every
-- array but the attempts', whose attempt_req says which request each
-- attempt belongs to (1-based).
--  1. Acknowledgements (ack_to[i] not NULL): the cursors still at ack_from[i]
--     and still of ownership epoch epochs[i] (NULL: any) move to ack_to[i],
--     in one UPDATE, and only their attempts are recorded. The others are
--     refused (below), not raised: one subscription moved elsewhere must not
--     fail the others.
--  2. Reads (peeks[i]): the batch after peek_after[i] (the cursor when NULL),
--     as webhook_step returned it: the events of the range on its streams
--     that pass its filter, then one row without an event (so that a range
--     holding nothing for it can be acknowledged). Requests that read the
--     same range with the same filter, unordered and with no backfill aimed
--     at them, share ONE read of the union of their streams: each event
--     comes back once, with the requests on its stream in reqs.
-- A refused request gets one row, reqs = {i}, refused = the SQLSTATE
-- webhook_step would raise: PF001 (cursor moved), PF002 (another relay's
-- epoch), 42704 (no such consumer), 55000 (its tick is no longer retained).
-- A request with nothing new gets no row, and so does one of a stalled
-- subscription (retention skipped events for it, migration 0014: nothing
-- more is read for it until an operator resumes it).
--
-- Calls:   ferry._batch_end, ferry._filter_match, ferry.batch_events
-- Reads:   ferry.backfills, ferry.consumers, ferry.retries, ferry.subscriptions, ferry.ticks
-- Writes:  ferry.attempts, ferry.consumers
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.webhook_steps(
    subscriptions text[], consumers text[], epochs bigint[], ordered boolean[],
    ack_from bigint[], ack_to bigint[], peeks boolean[], peek_after bigint[],
    attempt_req integer[], event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[],
    max_events integer)
returns table (reqs integer[], refused text, start_tick bigint, end_tick bigint, more boolean, id bigint,
               stream text, key text, payload text, headers text, created_at timestamptz, blocked boolean)
language plpgsql as $$
declare
    v_moved integer[];
    v_refused integer[] := '{}';
    v_latest bigint;
    v_more boolean;
    g record;
begin
    -- 1. Acknowledgements.
    with a as (
        select u.i::integer as i, u.c, u.ep, u.f, u.t
        from unnest(consumers, epochs, ack_from, ack_to) with ordinality as u(c, ep, f, t, i)
        where u.t is not null
    ), moved as (
        update ferry.consumers c set tick_id = a.t, next_tick_id = null, batch_id = null, updated_at = now()
        from a
        where c.name = a.c and c.tick_id = a.f and (a.ep is null or c.owner_epoch = a.ep)
        returning a.i
    )
    select coalesce(array_agg(m.i), '{}') into v_moved from moved m;

    insert into ferry.attempts (subscription, event_id, attempt, status, latency_ms)
    select subscriptions[u.r], u.e, u.a, u.s, u.l
    from unnest(attempt_req, event_ids, attempt_nos, statuses, latencies) as u(r, e, a, s, l)
    where u.r = any (v_moved);

    for g in
        select u.i::integer as i,
               case when c.name is null then '42704'
                    when u.ep is not null and c.owner_epoch <> u.ep then 'PF002'
                    else 'PF001' end as why
        from unnest(consumers, epochs, ack_to) with ordinality as u(cn, ep, t, i)
        left join ferry.consumers c on c.name = u.cn
        where u.t is not null and not (u.i::integer = any (v_moved))
    loop
        v_refused := v_refused || g.i;
        return query select array[g.i], g.why, null::bigint, null::bigint, null::boolean, null::bigint, null::text,
                            null::text, null::text, null::text, null::timestamptz, null::boolean;
    end loop;

    -- 2. Reads: where each request starts, whether it may read, and its batch's end.
    select max(t.id) into v_latest from ferry.ticks t;
    for g in
        with r as (
            select u.i::integer as i, u.s, u.cn, u.o, c.name as found, c.streams, c.owner_epoch, u.ep,
                   coalesce(u.pa, c.tick_id) as v_start, sub.filter, sub.state,
                   exists (select 1 from ferry.backfills b where b.target = u.cn) as targeted
            from unnest(subscriptions, consumers, epochs, ordered, peeks, peek_after)
                 with ordinality as u(s, cn, ep, o, p, pa, i)
            left join ferry.consumers c on c.name = u.cn
            left join ferry.subscriptions sub on sub.name = u.s
            where u.p and not (u.i::integer = any (v_refused))
        ), checked as (
            select r.*,
                   case when r.found is null then '42704'
                        when r.ep is not null and r.owner_epoch <> r.ep then 'PF002'
                        when not exists (select 1 from ferry.ticks t where t.id = r.v_start) then '55000' end as why
            from r
        ), ends as (
            select k.*, case when k.why is null and k.v_start < v_latest and k.state is distinct from 'stalled'
                             then ferry._batch_end(k.v_start, max_events) end as v_end
            from checked k
        )
        -- Refusals one by one; the rest grouped by the range they read and their filter
        -- (ordered requests, and those a backfill is aimed at, alone: their rows differ).
        select array_agg(e.i order by e.i) as members, array_agg(e.cn order by e.i) as member_consumers,
               min(e.why) as why, e.v_start, e.v_end, e.filter, bool_or(e.o) as is_ordered,
               min(e.s) as one_sub, min(e.cn) as one_consumer, min(e.streams) as one_streams
        from ends e
        where e.why is not null or e.v_end is not null
        group by e.v_start, e.v_end, e.filter, e.why,
                 case when e.why is not null or e.o or e.targeted then e.i end
    loop
        if g.why is not null then
            return query select g.members, g.why, null::bigint, null::bigint, null::boolean, null::bigint, null::text,
                                null::text, null::text, null::text, null::timestamptz, null::boolean;
            continue;
        end if;
        v_more := exists (select 1 from ferry.ticks t where t.id > g.v_end);  -- newer ticks, even since we began
        -- One read of the range for the whole group, each event for the members on its
        -- stream; and one row without an event for every member, so that each can
        -- acknowledge the range even when nothing in it is for it.
        if cardinality(g.members) = 1 then  -- alone: its own read, as webhook_step made it
            return query
                select g.members, null::text, g.v_start, g.v_end, v_more, ev.id, ev.stream, ev.key,
                       ev.payload::text, ev.headers::text, ev.created_at,
                       g.is_ordered and ev.key is not null
                       and exists (select 1 from ferry.retries rt where rt.subscription = g.one_sub and rt.key = ev.key)
                from ferry.batch_events(g.v_start, g.v_end, g.one_streams, g.one_consumer) ev
                where ferry._filter_match(g.filter::jsonpath, ev.stream, ev.key, ev.headers, ev.payload);
        else
            return query
                with ms as (  -- the members on each stream
                    select st.stream, array_agg(u.i order by u.i) as members
                    from unnest(g.members, g.member_consumers) as u(i, cn)
                    join ferry.consumers c on c.name = u.cn
                    cross join lateral unnest(c.streams) as st(stream)
                    group by st.stream
                )
                select ms.members, null::text, g.v_start, g.v_end, v_more, ev.id, ev.stream,
                       ev.key, ev.payload::text, ev.headers::text, ev.created_at, false
                from ferry.batch_events(g.v_start, g.v_end, (select array_agg(ms.stream) from ms), null) ev
                join ms on ms.stream = ev.stream
                where ferry._filter_match(g.filter::jsonpath, ev.stream, ev.key, ev.headers, ev.payload)
                order by ev.id;
        end if;
        return query select g.members, null::text, g.v_start, g.v_end, v_more, null::bigint,
                            null::text, null::text, null::text, null::text, null::timestamptz, false;
    end loop;
end $$;
