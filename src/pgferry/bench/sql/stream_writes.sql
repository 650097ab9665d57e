-- SQL of `pgferry bench stream-writes` (bench/stream_writes.py).

-- name: setup
-- ferry.publish and ferry.publish_many exactly as they were before streams could be closed
-- (release 0eb7d3a, before migration 0010), to measure what the closed-stream probe and the
-- reserved-header check cost a writer.
create or replace function public.bench_publish_before(stream text, payload jsonb, key text default null, headers jsonb default null)
returns bigint language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    v_txid xid8;
    v_part smallint;
    v_id   bigint;
begin
    -- Checks inline (not via helper calls): publish is on the writer's hot path.
    if stream is null or length(stream) > 200 or btrim(stream) = '' then
        perform ferry._check_stream(stream);  -- raises the precise error
    end if;
    if payload is null then
        raise exception 'pgferry: payload must not be NULL (use ''null''::jsonb for a JSON null)' using errcode = '22004';
    end if;
    if headers is not null and jsonb_typeof(headers) <> 'object' then
        perform ferry._check_headers(headers);  -- raises the precise error
    end if;
    -- Take the transaction id before reading the partition pointer: rotation relies on it.
    v_txid := pg_current_xact_id();
    v_part := ferry._current_partition();
    -- Straight into the partition: routing through the parent costs more than the insert.
    if v_part = 0 then
        insert into ferry.events_0 (part, txid, stream, key, payload, headers)
        values (0, v_txid, stream, key, payload, headers) returning id into v_id;
    elsif v_part = 1 then
        insert into ferry.events_1 (part, txid, stream, key, payload, headers)
        values (1, v_txid, stream, key, payload, headers) returning id into v_id;
    else
        insert into ferry.events_2 (part, txid, stream, key, payload, headers)
        values (2, v_txid, stream, key, payload, headers) returning id into v_id;
    end if;
    return v_id;
end $$;

create or replace function public.bench_publish_many_before(streams text[], payloads jsonb[], keys text[] default null, headers jsonb[] default null)
returns setof bigint language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    n int := coalesce(cardinality(payloads), 0);
    v_txid xid8;
    v_part smallint;
begin
    if coalesce(cardinality(streams), 0) <> n
       or (keys is not null and cardinality(keys) <> n)
       or (headers is not null and cardinality(headers) <> n) then
        raise exception 'pgferry: publish_many needs arrays of the same length (streams %, payloads %, keys %, headers %)',
            cardinality(streams), n, cardinality(keys), cardinality(headers) using errcode = '22023';
    end if;
    if exists (select 1 from unnest(streams) s where s is null or btrim(s) = '' or length(s) > 200) then
        raise exception 'pgferry: every stream must be a non-empty name of at most 200 characters' using errcode = '22023';
    end if;
    if exists (select 1 from unnest(payloads) p where p is null) then
        raise exception 'pgferry: payload must not be NULL (use ''null''::jsonb for a JSON null)' using errcode = '22004';
    end if;
    if exists (select 1 from unnest(headers) h where h is not null and jsonb_typeof(h) <> 'object') then
        raise exception 'pgferry: headers must be JSON objects of strings' using errcode = '22023';
    end if;
    v_txid := pg_current_xact_id();
    v_part := ferry._current_partition();
    return query
    insert into ferry.events (part, txid, stream, key, payload, headers)
    select v_part, v_txid, u.s, u.k, u.p, u.h
    from unnest(streams, payloads, coalesce(keys, array_fill(null::text, array[n])),
                coalesce(headers, array_fill(null::jsonb, array[n]))) with ordinality as u(s, p, k, h, ord)
    order by u.ord
    returning id;
end $$;

-- name: reset
-- Every cell starts from an empty log (and without the index).
drop index if exists ferry.bench_events_stream_idx;
truncate ferry.events_0, ferry.events_1, ferry.events_2

-- name: add_index
-- The index on (stream) a history reader would use, as a writer would pay for it.
create index bench_events_stream_idx on ferry.events (stream, txid)

-- name: close_many
-- $1 streams closed beforehand (a long-lived system with many finished chat answers).
insert into ferry.closed_streams (stream, end_event, end_txid)
select 'done:' || g, g, pg_current_xact_id() from generate_series(1, $1) g
on conflict do nothing

-- name: fill
-- $1 events across $2 streams, in transactions of 10,000 (the history a reader looks into).
select count(*) from ferry.publish_many(
    array(select 'chat:' || (g % $2) from generate_series(1, $1) g),
    array(select jsonb_build_object('token', 'word ' || g) from generate_series(1, $1) g))

-- name: scan_stream
-- A stream's history without an index: every event of the retained log filtered by stream.
select count(*) from ferry.events where stream = $1

-- name: index_stream
-- The same through the index.
select count(*) from ferry.events where stream = $1 and txid >= '0'::xid8
