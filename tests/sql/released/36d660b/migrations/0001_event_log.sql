-- pgferry 0001: the durable, commit-ordered event log.
--
-- Writers append to ferry.events inside their own transaction (ferry.publish,
-- capture triggers). The relay's ticker records snapshots in ferry.ticks; a
-- batch for a consumer is "every event whose transaction committed between two
-- ticks", which is exact no matter in which order transactions got their ids
-- or committed (the Skytools PgQ technique, in plain SQL on xid8/pg_snapshot).
--
-- Nothing here sends NOTIFY from a writer path: only ferry.tick(), called by
-- the single elected ticker, notifies, once per tick.

create schema if not exists ferry;

-- Event ids are handed out in call order (no sequence cache) so that two
-- writes to one key, serialized by a row lock, get increasing ids.
create sequence ferry.event_id_seq as bigint no cycle;
create sequence ferry.tick_id_seq as bigint no cycle;
create sequence ferry.batch_id_seq as bigint no cycle;

-- Which events partition writers append to. A sequence, not a table row, on
-- purpose: setval() is seen at once by every transaction whatever its
-- snapshot (even REPEATABLE READ ones), which is what makes rotation safe.
create sequence ferry.current_partition_seq as smallint minvalue 0 maxvalue 2 start 0 no cycle;

create table ferry.events (
    id          bigint      not null default nextval('ferry.event_id_seq'),
    part        smallint    not null,
    txid        xid8        not null default pg_current_xact_id(),
    stream      text        not null,
    key         text,
    payload     jsonb       not null,
    headers     jsonb,
    created_at  timestamptz not null default now()
) partition by list (part);

create table ferry.events_0 partition of ferry.events for values in (0);
create table ferry.events_1 partition of ferry.events for values in (1);
create table ferry.events_2 partition of ferry.events for values in (2);
create index events_txid_idx on ferry.events (txid);

comment on table ferry.events is
    'pgferry event log. Append-only; whole partitions are truncated once every consumer has passed them.';

-- Rotation state of the three partitions.
--   open_tick:   newest tick taken before the partition became current; reading
--                from it returns every event stored in the partition.
--   closed_xmax: the txid of a transaction started after writers stopped
--                choosing the partition. Every writer into it took its txid
--                before reading the pointer, so it has a smaller txid; once
--                every consumer's tick has xmin >= closed_xmax, the partition
--                holds nothing unread and may be truncated.
create table ferry.partitions (
    part         smallint    primary key check (part between 0 and 2),
    state        text        not null check (state in ('current', 'closing', 'closed', 'empty')),
    opened_at    timestamptz,
    open_tick    bigint,
    closed_at    timestamptz,
    closed_xmax  xid8
);

create table ferry.ticks (
    id          bigint       primary key,
    snapshot    pg_snapshot  not null,
    -- last event id handed out before the snapshot: bounds batch sizes cheaply
    event_seq   bigint       not null,
    created_at  timestamptz  not null default now()
);

create table ferry.consumers (
    name          text        primary key check (name <> '' and length(name) <= 200),
    streams       text[],                 -- null: every stream
    tick_id       bigint      not null,   -- cursor: everything visible at this tick is done
    next_tick_id  bigint,                 -- end of the batch handed out and not yet acked
    batch_id      bigint,
    created_at    timestamptz not null default now(),
    updated_at    timestamptz not null default now()
);

create table ferry.config (
    singleton          boolean  primary key default true check (singleton),
    rotation_interval  interval not null default '5 minutes',
    -- tick at least this often even with nothing new, so cursors (and with
    -- them retention) move past transactions that were in flight at the last tick
    idle_tick_interval interval not null default '10 seconds',
    max_batch_events   integer  not null default 5000 check (max_batch_events > 0)
);
insert into ferry.config default values;

insert into ferry.ticks (id, snapshot, event_seq)
values (nextval('ferry.tick_id_seq'), pg_current_snapshot(), 0);

insert into ferry.partitions (part, state, opened_at, open_tick)
values (0, 'current', now(), 1), (1, 'empty', null, null), (2, 'empty', null, null);

---------------------------------------------------------------------------
-- Capture
---------------------------------------------------------------------------

create function ferry._check_stream(p_stream text) returns void
language plpgsql immutable as $$
begin
    if p_stream is null or btrim(p_stream) = '' then
        raise exception 'pgferry: stream must be a non-empty name, got %', coalesce(quote_literal(p_stream), 'NULL')
            using errcode = '22023', hint = 'Pass the stream the event belongs to, e.g. ferry.publish(''orders'', ''{"id": 1}'').';
    end if;
    if length(p_stream) > 200 then
        raise exception 'pgferry: stream name is % characters long; the limit is 200', length(p_stream)
            using errcode = '22023';
    end if;
end $$;

create function ferry._check_headers(p_headers jsonb) returns void
language plpgsql immutable as $$
begin
    if p_headers is not null and jsonb_typeof(p_headers) <> 'object' then
        raise exception 'pgferry: headers must be a JSON object of strings, got a JSON %', jsonb_typeof(p_headers)
            using errcode = '22023', hint = 'Example: ''{"x-tenant": "acme"}''::jsonb';
    end if;
end $$;

-- The partition writers append to right now. Callers must already hold their
-- transaction id (see ferry.publish) so that rotation can bound late writers.
-- No FROM clause on purpose: the function is inlined into its callers instead
-- of being parsed and planned on every call (measured: ~16 us per call).
-- pg_sequence_last_value is NULL only before the first setval (start 0).
create function ferry._current_partition() returns smallint
language sql volatile as $$
    select coalesce(pg_sequence_last_value('ferry.current_partition_seq'::regclass), 0)::smallint
$$;

create function ferry.publish(stream text, payload jsonb, key text default null, headers jsonb default null)
returns bigint language plpgsql as $$
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

-- One round trip for many events; arrays must have equal length (keys and
-- headers may be null as a whole).
create function ferry.publish_many(streams text[], payloads jsonb[], keys text[] default null, headers jsonb[] default null)
returns setof bigint language plpgsql as $$
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

-- Name of the capture trigger function generated for a table.
create function ferry._capture_function(tbl regclass) returns text
language sql stable as $$ select format('ferry._capture_%s', tbl::oid) $$;

create function ferry.uncapture_table(tbl regclass) returns void
language plpgsql as $$
begin
    execute format('drop trigger if exists pgferry_capture_insert on %s', tbl);
    execute format('drop trigger if exists pgferry_capture_update on %s', tbl);
    execute format('drop trigger if exists pgferry_capture_delete on %s', tbl);
    execute format('drop function if exists %s()', ferry._capture_function(tbl));
end $$;

-- Installs statement-level triggers with transition tables. The trigger
-- function is generated per table, with the stream and the key expression
-- written in as a constant and column references: one set-based INSERT per
-- statement, the envelope built in one pass with to_jsonb over a row, and no
-- per-row branching (a generic function reading TG_ARGV cost ~25% more).
create function ferry.capture_table(
    tbl regclass,
    stream text default null,
    key_columns text[] default null,
    operations text[] default array['insert', 'update', 'delete'])
returns text language plpgsql as $$
declare
    v_schema  text;
    v_table   text;
    v_kind    "char";
    v_stream  text;
    v_keys    text[];
    v_ops     text[];
    v_op      text;
    v_missing text;
    v_fn      text := ferry._capture_function(tbl);
    v_key     text;
    v_body    text;
    v_p       integer;
begin
    select n.nspname, c.relname, c.relkind into v_schema, v_table, v_kind
    from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = tbl;
    if v_kind not in ('r', 'p') then
        raise exception 'pgferry: % is not a table; only tables can be captured', tbl using errcode = '42809';
    end if;
    v_stream := coalesce(stream, v_schema || '.' || v_table);
    perform ferry._check_stream(v_stream);

    if key_columns is null then
        select array_agg(a.attname::text order by k.ord) into v_keys
        from pg_index i
        cross join lateral unnest(i.indkey) with ordinality as k(attnum, ord)
        join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
        where i.indrelid = tbl and i.indisprimary;
        if v_keys is null then
            raise exception 'pgferry: table % has no primary key, so events would have no key', tbl
                using errcode = '42P10',
                      hint = 'Add a primary key, or name the key columns: ferry.capture_table(''' || tbl::text
                             || ''', key_columns => array[''col'']).';
        end if;
    else
        if cardinality(key_columns) = 0 then
            raise exception 'pgferry: key_columns must name at least one column' using errcode = '22023';
        end if;
        select string_agg(quote_ident(k), ', ') into v_missing from unnest(key_columns) k
        where not exists (select 1 from pg_attribute a where a.attrelid = tbl and a.attname = k
                          and a.attnum > 0 and not a.attisdropped);
        if v_missing is not null then
            raise exception 'pgferry: table % has no column(s) %', tbl, v_missing using errcode = '42703';
        end if;
        v_keys := key_columns;
    end if;

    select array_agg(distinct lower(o)) into v_ops from unnest(operations) o;
    foreach v_op in array coalesce(v_ops, '{}') loop
        if v_op not in ('insert', 'update', 'delete') then
            raise exception 'pgferry: unknown operation %; use insert, update and/or delete', quote_literal(v_op)
                using errcode = '22023';
        end if;
    end loop;

    -- The key of a row r: one column as text, several as a JSON array of values.
    if cardinality(v_keys) = 1 then
        v_key := format('(r.%I)::text', v_keys[1]);
    else
        v_key := format('jsonb_build_array(%s)::text',
                        (select string_agg(format('r.%I', k), ', ' order by i)
                         from unnest(v_keys) with ordinality x(k, i)));
    end if;

    -- One static INSERT per operation and partition, straight into the partition
    -- (tuple routing through the parent costs a noticeable share of a
    -- single-row statement). The UPDATE pairs old and new rows by position:
    -- the transition tables are filled row by row in lockstep, so this holds
    -- even when an update changes the key.
    v_body := '';
    foreach v_op in array array['INSERT', 'DELETE', 'UPDATE'] loop
        v_body := v_body || case v_op when 'INSERT' then 'if' else 'elsif' end
                  || format(' TG_OP = %L then', v_op) || E'\n';
        for v_p in 0..2 loop
            v_body := v_body || format(E'    %s v_part = %s then\n        insert into ferry.events_%s (part, txid, stream, key, payload)\n',
                                       case v_p when 0 then 'if' else 'elsif' end, v_p, v_p)
                || case v_op
                    when 'INSERT' then format(
                        '        select v_part, v_txid, %L, %s, to_jsonb(e) from pgferry_new r, lateral (select ''INSERT'' as type, '
                        'TG_TABLE_NAME as "table", TG_TABLE_SCHEMA as schema, r as record, null::jsonb as old_record) e;', v_stream, v_key)
                    when 'DELETE' then format(
                        '        select v_part, v_txid, %L, %s, to_jsonb(e) from pgferry_old r, lateral (select ''DELETE'' as type, '
                        'TG_TABLE_NAME as "table", TG_TABLE_SCHEMA as schema, null::jsonb as record, r as old_record) e;', v_stream, v_key)
                    else format(
                        '        select v_part, v_txid, %L, %s, to_jsonb(e) '
                        'from (select row_number() over () as pos, n from pgferry_new n) nw '
                        'join (select row_number() over () as pos, o from pgferry_old o) od using (pos), '
                        'lateral (select (nw.n).*) r, '
                        'lateral (select ''UPDATE'' as type, TG_TABLE_NAME as "table", TG_TABLE_SCHEMA as schema, '
                        'nw.n as record, od.o as old_record) e order by nw.pos;', v_stream, v_key)
                    end || E'\n';
        end loop;
        v_body := v_body || E'    end if;\n';
    end loop;
    v_body := v_body || 'end if;';

    perform ferry.uncapture_table(tbl);
    execute format($f$
        create function %1$s() returns trigger language plpgsql as $body$
        declare
            v_txid xid8 := pg_current_xact_id();
            v_part smallint := ferry._current_partition();
        begin
            %4$s
            return null;
        end $body$
    $f$, v_fn, v_stream, v_key, v_body);
    execute format('comment on function %s() is %L', v_fn, format('pgferry: capture of %s into stream %s', tbl, v_stream));

    if 'insert' = any (v_ops) then
        execute format('create trigger pgferry_capture_insert after insert on %s referencing new table as pgferry_new '
                       'for each statement execute function %s()', tbl, v_fn);
    end if;
    if 'update' = any (v_ops) then
        execute format('create trigger pgferry_capture_update after update on %s referencing old table as pgferry_old '
                       'new table as pgferry_new for each statement execute function %s()', tbl, v_fn);
    end if;
    if 'delete' = any (v_ops) then
        execute format('create trigger pgferry_capture_delete after delete on %s referencing old table as pgferry_old '
                       'for each statement execute function %s()', tbl, v_fn);
    end if;
    return v_stream;
end $$;

---------------------------------------------------------------------------
-- Ticks and batches
---------------------------------------------------------------------------

-- Records a tick when something committed since the last one (or when the
-- last tick is older than idle_tick_interval), and sends one NOTIFY for it.
-- Returns the new tick id and whether it was only an idle tick, or no row.
-- Called only by the elected ticker.
create function ferry._tick(force boolean default false, out tick_id bigint, out idle boolean)
returns setof record language plpgsql as $$
declare
    v_last ferry.ticks;
    v_seq  bigint;
    v_new  boolean;
begin
    -- One tick at a time, even if someone calls ferry.tick() by hand while the
    -- relay's ticker runs: tick ids must follow snapshot order.
    perform pg_advisory_xact_lock(28774, 4);
    -- Something may have committed since the last tick when: the event counter
    -- moved; or a transaction the last tick listed as in progress committed
    -- with events; or an event of a transaction at or above the last tick's
    -- xmax became visible (the newest running transaction is not listed in
    -- xip, yet its events may already be counted in event_seq).
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
    values (nextval('ferry.tick_id_seq'), pg_current_snapshot(), v_seq)
    returning id into tick_id;
    perform pg_notify('pgferry_tick', tick_id::text);
    idle := not v_new;
    return next;
end $$;

create function ferry.tick(force boolean default false) returns bigint
language sql as $$ select tick_id from ferry._tick(force) $$;

create function ferry.register_consumer(name text, streams text[] default null, start_at text default 'now')
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
    if start_at = 'now' then
        select max(id) into v_tick from ferry.ticks;
    elsif start_at = 'beginning' then
        select min(p.open_tick) into v_tick from ferry.partitions p where p.state <> 'empty';
    else
        raise exception 'pgferry: start_at must be ''now'' or ''beginning'', got %', quote_literal(start_at)
            using errcode = '22023';
    end if;
    insert into ferry.consumers (name, streams, tick_id) values (name, streams, v_tick)
    on conflict on constraint consumers_pkey do update set streams = excluded.streams, updated_at = now();
    return (select c.tick_id from ferry.consumers c where c.name = register_consumer.name);
end $$;

create function ferry.unregister_consumer(name text) returns boolean
language sql as $$
    with d as (delete from ferry.consumers c where c.name = unregister_consumer.name returning 1)
    select exists (select 1 from d)
$$;

-- Hands out the consumer's next batch: from its cursor tick to a later tick,
-- spanning as many ticks as fit in about max_batch_events events. The same
-- batch is handed out again until it is acknowledged with finish_batch().
create function ferry.next_batch(consumer text, max_events integer default null)
returns table (batch_id bigint, start_tick bigint, end_tick bigint, streams text[])
language plpgsql as $$
declare
    c ferry.consumers;
    v_start_seq bigint;
    v_end bigint;
    v_limit integer := coalesce(max_events, (select max_batch_events from ferry.config));
begin
    select * into c from ferry.consumers where name = consumer for update;
    if not found then
        raise exception 'pgferry: consumer % does not exist', quote_literal(consumer) using errcode = '42704',
            hint = 'Create it with ferry.register_consumer(name, streams, start_at) or the Python API.';
    end if;
    if c.next_tick_id is null then
        select t.event_seq into v_start_seq from ferry.ticks t where t.id = c.tick_id;
        if not found then
            raise exception 'pgferry: the position of consumer % (tick %) is no longer retained', quote_literal(consumer), c.tick_id
                using errcode = '55000', hint = 'Drop it with ferry.unregister_consumer(name) and register it again to start over.';
        end if;
        select max(t.id) into v_end from ferry.ticks t
        where t.id > c.tick_id and t.event_seq <= v_start_seq + v_limit;
        if v_end is null then
            select min(t.id) into v_end from ferry.ticks t where t.id > c.tick_id;
        end if;
        if v_end is null then
            return;
        end if;
        update ferry.consumers set next_tick_id = v_end, batch_id = nextval('ferry.batch_id_seq'), updated_at = now()
        where name = consumer returning * into c;
    end if;
    batch_id := c.batch_id;
    start_tick := c.tick_id;
    end_tick := c.next_tick_id;
    streams := c.streams;
    return next;
end $$;

-- The events of a batch: committed after start_tick and no later than end_tick,
-- in id order. Scans the txid range from start_tick's xmax (not its xmin, so
-- one long transaction cannot make every read slow) plus the few transactions
-- start_tick listed as in progress.
create function ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null)
returns setof ferry.events
language sql stable as $$
    with a as (select snapshot from ferry.ticks where id = start_tick),
         b as (select snapshot from ferry.ticks where id = end_tick)
    select e.* from ferry.events e, a, b
    where e.txid >= pg_snapshot_xmax(a.snapshot) and e.txid < pg_snapshot_xmax(b.snapshot)
      and pg_visible_in_snapshot(e.txid, b.snapshot)
      and (streams is null or e.stream = any (streams))
    union all
    select e.* from ferry.events e, a, b
    where e.txid = any (array(select pg_snapshot_xip(a.snapshot)))
      and pg_visible_in_snapshot(e.txid, b.snapshot)
      and (streams is null or e.stream = any (streams))
    order by id
$$;

create function ferry.finish_batch(consumer text, batch bigint) returns void
language plpgsql as $$
begin
    update ferry.consumers set tick_id = next_tick_id, next_tick_id = null, batch_id = null, updated_at = now()
    where name = consumer and batch_id = batch;
    if not found then
        raise exception 'pgferry: batch % is not the open batch of consumer %', batch, quote_literal(consumer)
            using errcode = '55000', hint = 'It was already acknowledged, or the consumer was reset.';
    end if;
end $$;

---------------------------------------------------------------------------
-- Retention: rotate partitions and truncate the ones every consumer passed
---------------------------------------------------------------------------

-- One maintenance step; the elected relay calls it every few seconds.
-- Returns what it did, for the relay's log.
create function ferry.maintain() returns text[]
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
    -- the newest tick) has passed.
    select min(pg_snapshot_xmin(t.snapshot)) into v_min_xmin
    from ferry.consumers c join ferry.ticks t on t.id = c.tick_id;
    if v_min_xmin is null then
        select pg_snapshot_xmin(t.snapshot) into v_min_xmin from ferry.ticks t order by id desc limit 1;
    end if;
    for p in select * from ferry.partitions where state = 'closed' and closed_xmax <= v_min_xmin loop
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
