-- ferry.register_consumer(name text, streams text[] default null, start_at text default 'now') returns bigint
--
-- Creates a consumer (or changes its streams): a named cursor that reads the
-- log from start_at ('now': the newest tick; 'beginning': the oldest retained),
-- only streams (NULL: every stream). Returns its tick. While it exists it holds
-- back retention of what it has not read.
--
-- Calls:   -
-- Reads:   ferry.partitions, ferry.subscriptions, ferry.ticks
-- Writes:  ferry.consumers
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.register_consumer(name text, streams text[] default null, start_at text default 'now')
returns bigint language plpgsql as $$
declare
    v_tick bigint;
begin
    if name is null or btrim(name) = '' or length(name) > 200 then
        raise exception 'pgferry: consumer name must be a non-empty name of at most 200 characters' using errcode = '22023';
    end if;
    if streams is not null and (cardinality(streams) = 0
        or exists (select 1 from unnest(streams) s where s is null or btrim(s) = '')) then
        raise exception 'pgferry: streams must be NULL (all streams) or a list of non-empty stream names' using errcode = '22023';
    end if;
    if streams is not null then  -- a stream listed twice is one stream (as ferry.subscribe keeps it)
        register_consumer.streams := array(select u.s from unnest(register_consumer.streams) with ordinality u(s, n)
                                           group by u.s order by min(u.n));
    end if;
    if start_at = 'now' then
        select max(id) into v_tick from ferry.ticks;
    elsif start_at = 'beginning' then
        select min(p.open_tick) into v_tick from ferry.partitions p where p.state <> 'empty';
    else
        raise exception 'pgferry: start_at must be ''now'' or ''beginning'', got %', quote_literal(start_at)
            using errcode = '22023';
    end if;
    -- A subscription's consumer knows its subscription (migration 0018), however it was made.
    insert into ferry.consumers (name, streams, tick_id, subscription)
    values (name, streams, v_tick,
            (select s.name from ferry.subscriptions s
             where register_consumer.name like 'webhook:%' and s.name = substr(register_consumer.name, 9)))
    on conflict on constraint consumers_pkey do update set streams = excluded.streams, updated_at = now();
    return (select c.tick_id from ferry.consumers c where c.name = register_consumer.name);
end $$;
