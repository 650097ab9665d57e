-- pgferry 0003: compact capture rows; the envelope is built when a batch is read.
--
-- A captured row used to be stored as its whole Supabase envelope
-- ({type, schema, table, record, old_record}). Measured on the writer's hot
-- path (see docs/benchmarks.md), building and storing that envelope was the
-- largest avoidable cost of a single-row insert. Capture triggers now store
-- the record as it is, plus which capture wrote it and the kind of change;
-- ferry.batch_events puts the same envelope back together for every reader,
-- so consumers see no difference.
--
-- Rows written by capture functions generated before this migration carry
-- op = NULL and their full envelope, and are read as they are: nothing needs
-- rewriting. Run ferry.capture_table again on such a table to switch it to
-- the compact form.

-- Every capture_table call is recorded, and the row is never deleted while
-- events may still point at it: the schema and table name of an event come
-- from here, as they were when the capture was set up.
create table ferry.captures (
    id             integer     generated always as identity primary key,
    relid          oid         not null,
    schema_name    text        not null,
    table_name     text        not null,
    stream         text        not null,
    key_columns    text[]      not null,
    operations     text[]      not null,
    created_at     timestamptz not null default now(),
    uncaptured_at  timestamptz
);

create index captures_relid_idx on ferry.captures (relid) where uncaptured_at is null;

comment on table ferry.captures is
    'pgferry: tables captured with ferry.capture_table, current and past (uncaptured_at set).';

-- capture:     ferry.captures.id of the capture that wrote the row, NULL for published events.
-- op:          'I', 'U' or 'D' for captured rows, NULL for published events.
-- old_payload: the row before an UPDATE.
alter table ferry.events
    add column capture     integer,
    add column op          "char",
    add column old_payload jsonb;

-- The name of the trigger function generated for one operation on a table.
create function ferry._capture_function(tbl regclass, operation text) returns text
language sql immutable as $$ select format('ferry._capture_%s_%s', tbl::oid, operation) $$;

create or replace function ferry.uncapture_table(tbl regclass) returns void
language plpgsql as $$
declare
    v_op text;
begin
    foreach v_op in array array['insert', 'update', 'delete'] loop
        if exists (select 1 from pg_trigger where tgrelid = tbl and tgname = 'pgferry_capture_' || v_op) then
            execute format('drop trigger pgferry_capture_%s on %s', v_op, tbl);
        end if;
        execute format('drop function if exists %s()', ferry._capture_function(tbl, v_op));
    end loop;
    -- The single function of captures made before 0003.
    if to_regprocedure(ferry._capture_function(tbl) || '()') is not null then
        execute format('drop function %s()', ferry._capture_function(tbl));
    end if;
    update ferry.captures set uncaptured_at = now() where relid = tbl and uncaptured_at is null;
end $$;

-- Installs statement-level triggers with transition tables, one generated
-- function per operation. Everything known at capture time is written into
-- the function as a constant (stream, capture id, key expression, target
-- partition): the statement has no parameters, no per-row branching and no
-- TG_OP test, which measured faster than any generic function.
create or replace function ferry.capture_table(
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
    v_key     text;
    v_capture integer;
    v_select  text;
    v_body    text;
    v_fn      text;
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

    select array_agg(distinct lower(o) order by lower(o)) into v_ops from unnest(operations) o;
    foreach v_op in array coalesce(v_ops, '{}') loop
        if v_op not in ('insert', 'update', 'delete') then
            raise exception 'pgferry: unknown operation %; use insert, update and/or delete', quote_literal(v_op)
                using errcode = '22023';
        end if;
    end loop;
    if v_ops is null then
        raise exception 'pgferry: operations must name at least one of insert, update, delete' using errcode = '22023';
    end if;

    -- The key of a row r: one column as text, several as a JSON array of values.
    if cardinality(v_keys) = 1 then
        v_key := format('(r.%I)::text', v_keys[1]);
    else
        v_key := format('jsonb_build_array(%s)::text',
                        (select string_agg(format('r.%I', k), ', ' order by i)
                         from unnest(v_keys) with ordinality x(k, i)));
    end if;

    perform ferry.uncapture_table(tbl);
    insert into ferry.captures (relid, schema_name, table_name, stream, key_columns, operations)
    values (tbl, v_schema, v_table, v_stream, v_keys, v_ops)
    returning id into v_capture;

    foreach v_op in array v_ops loop
        -- The SELECT producing (key, payload, op, old_payload) for this operation.
        -- The txid column defaults to pg_current_xact_id(); an AFTER trigger
        -- runs after its statement wrote rows, so the transaction id is taken
        -- before the partition pointer is read, as rotation requires. The
        -- UPDATE pairs old and new rows by position: transition tables are
        -- filled row by row in lockstep, so this holds even when the key changes.
        v_select := case v_op
            when 'insert' then format(
                '%s, to_jsonb(r), ''I'', null::jsonb from pgferry_new r', v_key)
            when 'delete' then format(
                '%s, to_jsonb(r), ''D'', null::jsonb from pgferry_old r', v_key)
            else format(
                '%s, to_jsonb(r), ''U'', to_jsonb(od.o) '
                'from (select row_number() over () as pos, n from pgferry_new n) nw '
                'join (select row_number() over () as pos, o from pgferry_old o) od using (pos), '
                'lateral (select (nw.n).*) r order by nw.pos', v_key)
            end;
        -- Straight into the current partition: routing through the parent
        -- costs a noticeable share of a single-row statement.
        v_body := '';
        for v_p in 0..2 loop
            v_body := v_body || format(
                E'    %s v_part = %s then\n'
                 '        insert into ferry.events_%s (part, stream, capture, key, payload, op, old_payload)\n'
                 '        select %s, %L, %s, %s;\n',
                case v_p when 0 then 'if' else 'elsif' end, v_p, v_p, v_p, v_stream, v_capture, v_select);
        end loop;
        v_fn := ferry._capture_function(tbl, v_op);
        execute format($f$
            create function %1$s() returns trigger language plpgsql as $body$
            declare
                v_part smallint := ferry._current_partition();
            begin
            %2$s    end if;
                return null;
            end $body$
        $f$, v_fn, v_body);
        execute format('comment on function %s() is %L', v_fn,
                       format('pgferry: capture of %s %s into stream %s', v_op, tbl, v_stream));
        execute format('create trigger pgferry_capture_%s after %s on %s referencing %s for each statement execute function %s()',
                       v_op, v_op, tbl,
                       case v_op when 'insert' then 'new table as pgferry_new'
                                 when 'delete' then 'old table as pgferry_old'
                                 else 'old table as pgferry_old new table as pgferry_new' end,
                       v_fn);
    end loop;
    return v_stream;
end $$;

-- The payload readers see: a captured row (op set) in its Supabase envelope,
-- a published event as stored. STABLE like jsonb_build_object, so that it is
-- inlined into the queries that call it (an IMMUTABLE one would not be).
create function ferry._envelope(op "char", payload jsonb, old_payload jsonb, schema_name text, table_name text)
returns jsonb language sql stable as $$
    select case when op is null then payload
                else jsonb_build_object(
                    'type', case op when 'I' then 'INSERT' when 'U' then 'UPDATE' else 'DELETE' end,
                    'schema', schema_name,
                    'table', table_name,
                    'record', case when op = 'D' then null else payload end,
                    'old_record', case op when 'U' then old_payload when 'D' then payload end)
           end
$$;

-- The events of a batch: committed after start_tick and no later than end_tick,
-- in id order. Scans the txid range from start_tick's xmax (not its xmin, so
-- one long transaction cannot make every read slow) plus the few transactions
-- start_tick listed as in progress. Captured rows get their envelope here.
drop function ferry.batch_events(bigint, bigint, text[]);
create function ferry.batch_events(start_tick bigint, end_tick bigint, streams text[] default null)
returns table (id bigint, txid xid8, stream text, key text, payload jsonb, headers jsonb, created_at timestamptz)
language sql stable as $$
    with a as (select snapshot from ferry.ticks where id = start_tick),
         b as (select snapshot from ferry.ticks where id = end_tick),
         picked as (
             select e.* from ferry.events e, a, b
             where e.txid >= pg_snapshot_xmax(a.snapshot) and e.txid < pg_snapshot_xmax(b.snapshot)
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams))
             union all
             select e.* from ferry.events e, a, b
             where e.txid = any (array(select pg_snapshot_xip(a.snapshot)))
               and pg_visible_in_snapshot(e.txid, b.snapshot)
               and (streams is null or e.stream = any (streams)))
    select p.id, p.txid, p.stream, p.key,
           ferry._envelope(p.op, p.payload, p.old_payload, c.schema_name, c.table_name),
           p.headers, p.created_at
    from picked p left join ferry.captures c on c.id = p.capture
    order by p.id
$$;
