-- ferry.capture_table( tbl regclass, stream text default null, key_columns text[] default null, operations text[] default array['insert', 'update', 'delete']) returns text
--
-- Installs statement-level triggers with transition tables, one generated
-- function per operation. Everything known at capture time is written into
-- the function as a constant (stream, capture id, key expression, target
-- partition): the statement has no parameters, no per-row branching and no
-- TG_OP test, which measured faster than any generic function.
-- tbl: the table; stream: its stream (default schema.table); key_columns:
-- the event key (default the primary key, refused without one); operations:
-- which of insert, update, delete to capture. Returns the stream. Calling it
-- again replaces the capture (new settings, current code).
-- The generated functions (ferry._capture_<oid>_<operation>, data rather
-- than contract: not in these files) write ferry.events_0..2.
--
-- Calls:   ferry._capture_function, ferry._check_stream, ferry._current_partition, ferry.uncapture_table
-- Reads:   -
-- Writes:  ferry.captures
-- Raises:  22023, 42703, 42809, 42P10
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

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
