-- ferry.webhook_steps( subscriptions text[], consumers text[], epochs bigint[], ordered boolean[], ack_from bigint[], ack_to bigint[], peeks boolean[], peek_after bigint[], attempt_req integer[], event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[], max_events integer, max_bytes integer default null, spans integer[] default null, peek_until bigint[] default null, resume_after bigint[] default null, ack_part_end bigint[] default null, ack_part_done bigint[] default null, attempt_runs integer[] default null) returns table (reqs integer[], refused text, start_tick bigint, end_tick bigint, more boolean, id bigint, stream text, key text, payload text, headers text, created_at timestamptz, blocked boolean, cut_after bigint)
--
-- ferry.webhook_step for many subscriptions in one round trip: a relay with
-- 1,000 subscriptions on one stream makes one statement per tick, not 1,000,
-- and reads the tick's events once. Request i is the i-th element of every
-- array but the attempts', whose attempt_req says which request each
-- attempt belongs to (1-based). attempt_runs (migration 0032; NULL: one
-- event each, as a relay older than 0032 passes them): attempt k's request,
-- attempt number, status and latency apply to the next attempt_runs[k]
-- events of event_ids. A round's events mostly share them (a request's
-- hundred events): per event, encoding the four arrays was a sixth of a
-- relay's CPU draining a backlog (py-spy, `pgferry bench scale --backlog`).
--  1. Acknowledgements (ack_to[i] not NULL): the cursors still at ack_from[i]
--     and still of ownership epoch epochs[i] (NULL: any) move to ack_to[i],
--     in one UPDATE, and only their attempts are recorded. The others are
--     refused (below), not raised: one subscription moved elsewhere must not
--     fail the others. ack_from[i] = ack_to[i] moves nothing but records
--     and checks the cursor is still there (the parts of a range, below).
--     ack_part_end[i], ack_part_done[i] (migration 0023): the acknowledgement
--     ends with a part of a range read in parts, (ack_to[i], ack_part_end[i]]
--     delivered up to id ack_part_done[i]; kept in ferry.consumers, so that a
--     read from the cursor (peek_after[i] NULL, no resume_after[i]) resumes
--     after it, as a worker starting over does, instead of sending the parts
--     again.
--  2. Reads (peeks[i]): the batch after peek_after[i] (the cursor when NULL),
--     up to spans[i] events' worth of ticks (NULL: max_events), as
--     webhook_step returned it: the events of the range on its streams
--     that pass its filter, then one row without an event (so that a range
--     holding nothing for it can be acknowledged). Requests that read the
--     same range with the same filter, unordered and with no backfill aimed
--     at them, share ONE read of the union of their streams: each event
--     comes back once, with the requests on its stream in reqs.
-- Partitions (migration 0018): a consumer of partition p of N reads only the
-- events ferry._partition_of puts there (requests share a read only with
-- the same p and N); a draining one reads up to its drain_to tick and no
-- further; a new one reads nothing while an old one has not reached its
-- drain_to (ferry._subscription_consumers). A backfill aimed at the
-- subscription ('webhook:<name>') is read by each of its partitions.
-- A refused request gets one row, reqs = {i}, refused = the SQLSTATE
-- webhook_step would raise: PF001 (cursor moved), PF002 (another relay's
-- epoch), 42704 (no such consumer), 55000 (its tick is no longer retained).
-- A request with nothing new gets no row, and so does one of a stalled
-- subscription (retention skipped events for it, migration 0014: nothing
-- more is read for it until an operator resumes it).
--
-- The byte bound (max_bytes, migration 0015; NULL: none, as a relay older
-- than 0015 calls it). A read takes the events of its range in id order,
-- counting payload and headers as text over the events it returns (those
-- that pass its filter and are in its partition; for a shared read, every
-- such event of the union of its members' streams), until the next one would
-- pass max_bytes or it has gone through 4 x max_events (NULL:
-- ferry.config.max_batch_events) events of the range, returned or not; it
-- always takes at least one. Only the events it returns are rendered: a
-- partition's read renders its own share of the range. (The count cuts
-- only a range that is one huge tick, as the first after a relay was down
-- is: it is read in parts.) A read so cut
-- ends at the furthest tick t (ferry._batch_split) such that (a) no event
-- committed by t has an id above the last one read and (b) every event
-- handed out by earlier parts of the same range is
-- committed by t; it returns only the events committed by t, more = true,
-- cut_after NULL, and the cursor moves to t as usual. When no tick fits
-- (one transaction larger than the bound), the read is a part of the range
-- (peek_after[i], end_tick]: cut_after = the id of the last event read, and
-- the caller reads on with peek_until[i] = end_tick and resume_after[i] =
-- cut_after, and acknowledges every part with ack_from = ack_to = the
-- range's start, until the part that reaches its end (cut_after NULL).
-- A range is read whole, in id order, before any event after it: commit
-- order holds as with unbounded reads.
-- Shared reads and the bound: requests share a read only when they agree on
-- start, end, filter AND resume_after (the parts of a range shared by the
-- same members stay shared, and a member that falls out of step reads its
-- parts alone). The bound applies to the shared read as a whole: (a) and
-- (b), checked over the union of the members' streams, hold for each
-- member's own streams (a subset: the conditions only get stronger), so
-- each member gets a correct batch of at most max_bytes, and a member that
-- reads on alone (resume_after from a shared part) checks (b) over its own
-- streams, which the shared part's ids bound as well.
--
-- Calls:   ferry._batch_end, ferry._batch_rows, ferry._batch_split, ferry._envelope, ferry._envelope_text,
--          ferry._filter_match, ferry._partition_of
-- Reads:   ferry.backfills, ferry.captures, ferry.consumers, ferry.events, ferry.retries, ferry.subscriptions, ferry.ticks
-- Writes:  ferry.consumers, ferry.deliveries
-- Raises:  22023 (max_bytes not positive; resume_after[i] without peek_after[i] and peek_until[i])
-- Runs as: the caller (SECURITY INVOKER), with enable_seqscan off, jit off and
--          plan_cache_mode force_generic_plan. Left to choose, PostgreSQL
--          planned its statements again on every call (their array arguments
--          make custom plans look cheaper): 1.5 ms of planning in a 2.8 ms call,
--          and 3 ms more on every event's latency at 2,000 single-row inserts
--          a second (pg_stat_statements.track_planning). A generic plan made
--          after the log's partitions were analyzed empty scanned every
--          partition whole on each read (50-60 ms a read with 60,000 events in
--          one, until autovacuum analyzed it again): no sequential scans.
--          A bounded read of a range of over 1,000 events is planned for
--          its size (below), which costs ~1.5 ms and saves more. jit off:
--          in a session with JIT on, a 5,000-event read took 2.1 s, compiling
--          (relays turn it off for their sessions; this holds for any caller).
-- Callers: PUBLIC (the default)

create or replace function ferry.webhook_steps(
    subscriptions text[], consumers text[], epochs bigint[], ordered boolean[],
    ack_from bigint[], ack_to bigint[], peeks boolean[], peek_after bigint[],
    attempt_req integer[], event_ids bigint[], attempt_nos integer[], statuses integer[], latencies real[],
    max_events integer, max_bytes integer default null, spans integer[] default null,
    peek_until bigint[] default null, resume_after bigint[] default null,
    ack_part_end bigint[] default null, ack_part_done bigint[] default null, attempt_runs integer[] default null)
returns table (reqs integer[], refused text, start_tick bigint, end_tick bigint, more boolean, id bigint,
               stream text, key text, payload text, headers text, created_at timestamptz, blocked boolean,
               cut_after bigint)
language plpgsql set enable_seqscan = off set plan_cache_mode = force_generic_plan set jit = off as $$
declare
    v_moved integer[];
    v_refused integer[] := '{}';
    v_latest bigint;
    v_more boolean;
    g record;
    -- a read bounded in bytes
    v_alone boolean;
    v_streams text[];
    v_reader text;
    -- events one read takes at most: more than a range sized by max_events holds, so that only a
    -- range that is one huge tick is cut by the count, into few parts (each costs a scan of the rest)
    v_limit integer := 4 * coalesce(max_events, (select c.max_batch_events from ferry.config c));
    v_hi bigint;
    -- events the range holds, about (ticks' event_seq), and from how many a read plans for its own
    v_events bigint;
    v_plan_from constant integer := 1000;
    v_hi_txid_min xid8;
    -- a bounded read renders no event past this many bytes of stored size before it (below)
    v_render_bytes bigint := 4::bigint * max_bytes;
    v_hi_txid_max xid8;
begin
    if max_bytes is not null and max_bytes <= 0 then
        raise exception 'pgferry: max_bytes must be positive, got %', max_bytes using errcode = '22023',
            hint = 'Pass NULL for no byte bound.';
    end if;
    if exists (select 1 from unnest(peeks, peek_after, peek_until, resume_after) as u(p, pa, pu, ra)
               where u.ra is not null and (u.pa is null or u.pu is null)) then
        raise exception 'pgferry: resume_after needs peek_after and peek_until (the range being read on)'
            using errcode = '22023', hint = 'Pass back the start_tick and end_tick of the read that was cut.';
    end if;

    -- 1. Acknowledgements.
    with a as (
        select u.i::integer as i, u.c, u.ep, u.f, u.t, u.pe, u.pd
        from unnest(consumers, epochs, ack_from, ack_to, ack_part_end, ack_part_done)
             with ordinality as u(c, ep, f, t, pe, pd, i)
        where u.t is not null
    ), moved as (
        -- A part acknowledged (pe, pd: its range's end, its last id) is kept for the tick the
        -- cursor is at after this update; ferry._consumer_moved clears a part the cursor left.
        update ferry.consumers c set tick_id = a.t, next_tick_id = null, batch_id = null, updated_at = now(),
               part_start = case when a.pe is not null then a.t else c.part_start end,
               part_end = coalesce(a.pe, c.part_end), part_done = coalesce(a.pd, c.part_done)
        from a
        where c.name = a.c and c.tick_id = a.f and (a.ep is null or c.owner_epoch = a.ep)
        returning a.i
    )
    select coalesce(array_agg(m.i), '{}') into v_moved from moved m;

    -- one row per acknowledgement, attempt number and status (migration 0029)
    with runs as (
        select x.r, x.a, x.s, x.l, coalesce(x.n, 1) as n,
               sum(coalesce(x.n, 1)) over (order by x.k) - coalesce(x.n, 1) as done  -- events of earlier runs
        from unnest(attempt_req, attempt_nos, statuses, latencies, attempt_runs) with ordinality as x(r, a, s, l, n, k)
    ), u as (
        select runs.r, event_ids[runs.done + nth.j] as e, runs.a, runs.s, runs.l
        from runs
        join unnest(v_moved) as m(i) on m.i = runs.r  -- not "= any (v_moved)": a scan of it per run
        cross join generate_series(1, runs.n) as nth(j)
    )
    insert into ferry.deliveries (subscription, events, event_ids, latencies_ms, attempt, status)
    select subscriptions[u.r], int8range(min(u.e), max(u.e), '[]'), array_agg(u.e order by u.e),
           array_agg(u.l order by u.e), u.a, u.s
    from u
    group by u.r, u.a, u.s;

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
                            null::text, null::text, null::text, null::timestamptz, null::boolean, null::bigint;
    end loop;

    -- 2. Reads: where each request starts, whether it may read, and its batch's end.
    select max(t.id) into v_latest from ferry.ticks t;
    for g in
        -- Materialized: inlined, each CASE and EXISTS below ran once per reference to it.
        with r as materialized (
            select u.i::integer as i, u.s, u.cn, u.o, c.name as found, c.streams, c.owner_epoch, u.ep,
                   coalesce(u.pa, c.tick_id) as v_start,
                   -- from the cursor, where an earlier worker got to in a range read in parts
                   case when u.pa is null and u.ra is null and c.part_start = c.tick_id then c.part_end
                        else u.pu end as pu,
                   case when u.pa is null and u.ra is null and c.part_start = c.tick_id then c.part_done
                        else u.ra end as ra,
                   u.sp, sub.filter, sub.state,
                   c.part, c.parts, c.drain_to, coalesce('webhook:' || c.subscription, u.cn) as target,
                   c.drain_to is null and exists (select 1 from ferry.consumers o
                                                  where o.subscription = c.subscription and o.drain_to is not null
                                                    and o.tick_id < o.drain_to) as waiting
            from unnest(subscriptions, consumers, epochs, ordered, peeks, peek_after, peek_until, resume_after, spans)
                 with ordinality as u(s, cn, ep, o, p, pa, pu, ra, sp, i)
            left join ferry.consumers c on c.name = u.cn
            left join ferry.subscriptions sub on sub.name = u.s
            where u.p and not (u.i::integer = any (v_refused))
        ), checked as materialized (
            select r.*, exists (select 1 from ferry.backfills b where b.target = r.target) as targeted,
                   case when r.found is null then '42704'
                        when r.ep is not null and r.owner_epoch <> r.ep then 'PF002'
                        when not exists (select 1 from ferry.ticks t where t.id = r.v_start) then '55000' end as why
            from r
        ), readable as (
            select k.*, k.why is null and k.v_start < v_latest and k.state is distinct from 'stalled'
                        and not k.waiting and k.v_start < coalesce(k.drain_to, v_latest) as reads,
                   coalesce(k.sp, max_events) as span
            from checked k
        ), spans as (
            -- Each range start and size once (a tick's 1,000 requests mostly share one): _batch_end
            -- per request was a third of a statement of 290 acknowledgements and reads.
            select d.v_start, d.span, ferry._batch_end(d.v_start, d.span) as v_end
            from (select distinct k.v_start, k.span from readable k where k.reads and k.pu is null) d
        ), ends as (
            select k.*, case when k.reads then least(coalesce(k.pu, sp.v_end), k.drain_to) end as v_end
            from readable k
            left join spans sp on k.reads and k.pu is null and sp.v_start = k.v_start
                                  and sp.span is not distinct from k.span
        )
        -- Refusals one by one; the rest grouped by the range they read, their filter and where
        -- they resume in it (ordered requests, and those a backfill is aimed at, alone: their rows differ).
        select array_agg(e.i order by e.i) as members, array_agg(e.cn order by e.i) as member_consumers,
               min(e.why) as why, e.v_start, e.v_end, e.ra as resume_after, e.filter, bool_or(e.o) as is_ordered,
               min(e.s) as one_sub, min(e.target) as one_target, min(e.streams) as one_streams,
               min(e.part) as part, min(e.parts) as parts
        from ends e
        where e.why is not null or e.v_end is not null
        group by e.v_start, e.v_end, e.ra, e.filter, e.why, e.part, e.parts,
                 case when e.why is not null or e.o or e.targeted then e.i end
    loop
        if g.why is not null then
            return query select g.members, g.why, null::bigint, null::bigint, null::boolean, null::bigint, null::text,
                                null::text, null::text, null::text, null::timestamptz, null::boolean, null::bigint;
            continue;
        end if;
        v_more := exists (select 1 from ferry.ticks t where t.id > g.v_end);  -- newer ticks, even since we began
        v_alone := cardinality(g.members) = 1;
        if max_bytes is null and g.resume_after is null then
            -- One read of the range for the whole group, each event for the members on its
            -- stream; and one row without an event for every member, so that each can
            -- acknowledge the range even when nothing in it is for it.
            if v_alone then  -- alone: its own read, as webhook_step made it
                return query
                    select g.members, null::text, g.v_start, g.v_end, v_more, ev.id, ev.stream, ev.key,
                           ferry._envelope_text(ev.op, ev.payload, ev.old_payload, ev.schema_name, ev.table_name),
                           ev.headers::text, ev.created_at,
                           g.is_ordered and ev.key is not null
                           and exists (select 1 from ferry.retries rt where rt.subscription = g.one_sub
                                       and hashtextextended(rt.key, 0) = hashtextextended(ev.key, 0) and rt.key = ev.key),
                           null::bigint
                    from ferry._batch_rows(g.v_start, g.v_end, g.one_streams, g.one_target) ev
                    where ferry._filter_match(g.filter::jsonpath, ev.stream, ev.key, ev.headers,
                              ferry._envelope(ev.op, ev.payload, ev.old_payload, ev.schema_name, ev.table_name))
                      and (g.parts <= 1 or ferry._partition_of(ev.key, ev.id, g.parts) = g.part);
            else
                return query
                    with ms as (  -- the members on each stream
                        select st.stream, array_agg(u.i order by u.i) as members
                        from unnest(g.members, g.member_consumers) as u(i, cn)
                        join ferry.consumers c on c.name = u.cn
                        cross join lateral unnest(c.streams) as st(stream)
                        group by st.stream
                    )
                    select ms.members, null::text, g.v_start, g.v_end, v_more, ev.id, ev.stream, ev.key,
                           ferry._envelope_text(ev.op, ev.payload, ev.old_payload, ev.schema_name, ev.table_name),
                           ev.headers::text, ev.created_at, false, null::bigint
                    from ferry._batch_rows(g.v_start, g.v_end, (select array_agg(ms.stream) from ms), null) ev
                    join ms on ms.stream = ev.stream
                    where ferry._filter_match(g.filter::jsonpath, ev.stream, ev.key, ev.headers,
                              ferry._envelope(ev.op, ev.payload, ev.old_payload, ev.schema_name, ev.table_name))
                      and (g.parts <= 1 or ferry._partition_of(ev.key, ev.id, g.parts) = g.part)
                    order by ev.id;
            end if;
            return query select g.members, null::text, g.v_start, g.v_end, v_more, null::bigint,
                                null::text, null::text, null::text, null::text, null::timestamptz, false, null::bigint;
        else
            -- Bounded (or the rest of a range read in parts): the events in id order until the
            -- bound, then the cut (header).
            if v_alone then
                v_streams := g.one_streams;
                v_reader := g.one_target;
            else
                select array_agg(distinct st.stream) into v_streams
                from unnest(g.member_consumers) as u(cn)
                join ferry.consumers c on c.name = u.cn
                cross join lateral unnest(c.streams) as st(stream);
                v_reader := null;
            end if;
            -- A range of more events than one read takes (the first tick after a relay was
            -- down; a huge transaction, read on in parts): first the id the read's events end
            -- at, which builds no event, so that only those events are built and rendered, not
            -- every event of the rest of the range for every part (quadratic in its size); their
            -- transactions' ids bound the second scan to about those events' index entries.
            v_hi := null;
            v_events := (select t2.event_seq from ferry.ticks t2 where t2.id = g.v_end)
                        - (select t1.event_seq from ferry.ticks t1 where t1.id = g.v_start);
            if g.resume_after is not null or v_events > v_limit then
                select max(x.id), min(x.txid), max(x.txid) into v_hi, v_hi_txid_min, v_hi_txid_max
                from (select e.id, e.txid from ferry._batch_rows(g.v_start, g.v_end, v_streams, v_reader) e
                      where e.id > coalesce(g.resume_after, 0) order by e.id limit v_limit + 1) x;
            end if;
            -- One statement: each event's running size, in id order, decides whether the read
            -- takes it (r); where a read that was cut ends (k); its events that commit by then,
            -- and the range's closing row. Only the events it may return are rendered: a
            -- partition's read renders its own share of the range, not every event of it.
            -- Nor does it render events far past the bound: only while the stored size
            -- (pg_column_size, which does not detoast) of the events before one is within 4 x the
            -- bound; those past it are kept unrendered and not taken, so that the read knows it
            -- was cut. It rendered every event of the rest of its range, up to 4 x max_events:
            -- 400 rows of 800 KB of random text, 20 to a transaction, one tick, took 39.8 s to
            -- deliver, 6.0 s now (an outside probe's 2,000 arrived at ~0.7 rows/s, each read 4-10 s).
            -- Values that compress more than 4-fold are still rendered as before.
            -- A read of many events is planned for them: the generic plan, made for a guess of a
            -- few rows, looked each event's capture up by index (7 of a 5,000-event read's 56 ms).
            if v_events > v_plan_from then
                perform set_config('plan_cache_mode', 'force_custom_plan', true);
            end if;
            return query
                with r as materialized (
                    select x.*, x.n = 1 or (not x.beyond and x.n <= v_limit
                                            and (max_bytes is null or x.running <= max_bytes)) as taken
                    from (select y.*, row_number() over w as n,
                                 sum(coalesce(octet_length(y.payload), 0) + coalesce(octet_length(y.headers), 0))
                                     over w as running
                          from (select z.id, z.txid, z.stream, z.key, z.wanted, z.created_at, z.beyond,
                                       case when z.wanted then ferry._envelope_text(z.op, z.payload, z.old_payload,
                                                                                    z.schema_name, z.table_name) end
                                           as payload,
                                       case when z.wanted then z.headers::text end as headers
                                from (select e.*, not e.beyond
                                             and ferry._filter_match(g.filter::jsonpath, e.stream, e.key, e.headers,
                                                                     ferry._envelope(e.op, e.payload, e.old_payload,
                                                                                     e.schema_name, e.table_name))
                                             and (g.parts <= 1 or ferry._partition_of(e.key, e.id, g.parts) = g.part)
                                             as wanted
                                      from (select e.*,
                                                   coalesce(sum(pg_column_size(e.payload)
                                                                + coalesce(pg_column_size(e.old_payload), 0)
                                                                + coalesce(pg_column_size(e.headers), 0))
                                                            over (order by e.id rows between unbounded preceding
                                                                  and 1 preceding), 0) > v_render_bytes
                                                   is true as beyond
                                            from ferry._batch_rows(g.v_start, g.v_end, v_streams, v_reader) e
                                            where e.id > coalesce(g.resume_after, 0)
                                              and (v_hi is null
                                                   or (e.id <= v_hi and e.txid between v_hi_txid_min and v_hi_txid_max))
                                            order by e.id
                                            limit v_limit + 1) e) z  -- those past it: not rendered, not taken
                                offset 0) y  -- not pulled up: the window would render each event twice
                          window w as (order by y.id rows unbounded preceding)) x
                ), cut as (
                    select coalesce(bool_or(not r.taken), false) as cut, max(r.id) filter (where r.taken) as last
                    from r
                ), split as materialized (  -- _batch_split once, not once per reference to it
                    select c.cut, c.last,
                           case when c.cut then ferry._batch_split(g.v_start, g.v_end, v_streams, v_reader,
                                                                   g.resume_after, c.last) end as tick
                    from cut c
                ), k as (
                    -- A cut read ends at the split tick, or is a part of the range (cut_after) when
                    -- no tick fits.
                    select case when s.cut and s.tick <> g.v_start then s.tick else g.v_end end as v_end,
                           v_more or s.cut as more,
                           case when s.cut and s.tick = g.v_start then s.last end as cut_after,
                           t.snapshot
                    from split s
                    left join ferry.ticks t on s.cut and s.tick <> g.v_start and t.id = s.tick
                ), ms as materialized (  -- the members on each stream (a shared read), once
                    select st.stream, array_agg(u.i order by u.i) as members
                    from unnest(g.members, g.member_consumers) as u(i, cn)
                    join ferry.consumers c on c.name = u.cn
                    cross join lateral unnest(c.streams) as st(stream)
                    where not v_alone
                    group by st.stream
                )
                (select case when v_alone then g.members else ms.members end,
                        null::text, g.v_start, k.v_end, k.more, r.id, r.stream, r.key, r.payload, r.headers,
                        r.created_at,
                        g.is_ordered and r.key is not null
                        and exists (select 1 from ferry.retries rt where rt.subscription = g.one_sub
                                    and hashtextextended(rt.key, 0) = hashtextextended(r.key, 0) and rt.key = r.key),
                        k.cut_after
                 from r
                 cross join k
                 -- a member whose streams changed since v_streams was read has none of its own here
                 left join ms on ms.stream = r.stream
                 where r.taken and r.wanted and (k.snapshot is null or pg_visible_in_snapshot(r.txid, k.snapshot))
                   and (v_alone or ms.members is not null)
                 order by r.id)
                union all
                select g.members, null::text, g.v_start, k.v_end, k.more, null::bigint, null::text, null::text,
                       null::text, null::text, null::timestamptz, false, k.cut_after
                from k;
            perform set_config('plan_cache_mode', 'force_generic_plan', true);
        end if;
    end loop;
end $$;
