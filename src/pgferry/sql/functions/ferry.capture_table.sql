-- ferry.capture_table( tbl regclass, stream text default null, key_columns text[] default null, operations text[] default array['insert', 'update', 'delete'], condition text default null, columns text[] default null, exclude_columns text[] default null, changed_columns text[] default null, method text default 'trigger') returns text
--
-- Installs statement-level triggers with transition tables, one generated
-- function per operation. Everything known at capture time is written into
-- the function as a constant (stream, capture id, key expression, target
-- partition, and the filters below): the statement has no parameters, no
-- per-row branching and no TG_OP test, which measured faster than any
-- generic function. Without condition, columns, exclude_columns and
-- changed_columns the generated functions are exactly those of 0010.
-- tbl: the table; stream: its stream (default schema.table); key_columns:
-- the event key (default the primary key, refused without one); operations:
-- which of insert, update, delete to capture.
-- condition: a boolean expression over the row's columns by name (no
-- subqueries); only rows that match are captured, and an UPDATE when its
-- old OR its new row matches (a row leaving the filter is seen leaving;
-- one entering it, entering). Stored deparsed (ferry._capture_condition).
-- columns / exclude_columns (not both): the columns record and old_record
-- keep / leave out. The key is computed from the whole row, so key columns
-- may be left out of the record and events still carry their key.
-- changed_columns (needs update among operations): an UPDATE is captured
-- only when one of these columns IS DISTINCT FROM before (its type's `=`:
-- refused when that cannot compare its values, ferry._incomparable_type); old and new rows
-- are paired by position, so an UPDATE that changes the primary key is
-- compared row for row like any other (name the key columns here too to
-- capture key changes). With condition as well, both must hold.
-- A partitioned table, a partition or a table in an inheritance tree
-- captured by trigger: a NOTICE says which writes its triggers do not see
-- (ferry._capture_note). A condition over columns the record leaves out:
-- a NOTICE (ferry._condition_outside_record_note).
-- Refused: ferry's own tables (a capture of ferry.subscriptions would copy
-- signing secrets into the log), and key_columns that exclude_columns
-- names (the key would carry what the record leaves out).
-- Returns the stream. Calling it again replaces the capture (new settings,
-- current code). Locks the table (SHARE ROW EXCLUSIVE) until commit, so that
-- no writer's transaction straddles the switch from one capture to the next. Dropping or renaming a column a condition, columns or
-- changed_columns names makes the table's writes fail until capture_table
-- is called again (the generated code names it).
-- The generated functions (ferry._capture_<oid>_<operation>, data rather
-- than contract: not in these files) write ferry.events_0..2.
-- method 'wal' (migration 0020): no trigger; the table joins the
-- publication pgferry manages, and the relay decodes its changes from the
-- WAL (ferry._append_wal) with the same settings, TRUNCATE included. The
-- slot is created on the first such capture, before anything else this
-- transaction writes (PostgreSQL refuses to create one after a write). A
-- table with REPLICA IDENTITY DEFAULT is set to FULL (and so are its
-- partitions), so that old_record and unchanged TOASTed values are whole,
-- as with triggers; one with
-- REPLICA IDENTITY NOTHING is refused (publishing it would make
-- PostgreSQL refuse the table's UPDATEs and DELETEs), and so is one USING
-- INDEX an index without all the key columns (its DELETEs would have no key),
-- and one with inheritance children (not partitions: the WAL gives their
-- rows' changes as the children's).
-- method 'trigger' on a table captured from the WAL (or whose WAL capture
-- ended with changes not yet appended) first waits, table locked, until the
-- relay has appended its changes so far (ferry._wait_for_wal_capture): a
-- switch keeps each row's events in commit order.
--
-- Calls:   ferry._capture_condition, ferry._capture_function, ferry._capture_generator, ferry._capture_note,
--          ferry._check_columns, ferry._check_stream, ferry._condition_outside_record_note, ferry._incomparable_type,
--          ferry._current_partition, ferry._ensure_wal_slot, ferry._key_expression, ferry._record_expression,
--          ferry._lock_for_capture, ferry._wait_for_wal_capture, ferry.uncapture_table
-- Reads:   ferry.wal_slot, pg_partition_tree
-- Writes:  ferry.captures, the publication (method 'wal'), REPLICA IDENTITY of the table and its partitions
-- Raises:  22023, 42601, 42703, 42809, 42P10, 42883 (changed_columns of a type without equality), 55P03 (the
--          table held by another transaction for 10 s, ferry._lock_for_capture), 55000
--          (method 'wal': REPLICA IDENTITY NOTHING or an index without the key, wal_level, the slot; ferry._ensure_wal_slot;
--          method 'trigger': WAL capture did not append the table's changes in time, ferry._wait_for_wal_capture), 22007;
--          what the condition raises (ferry._capture_condition)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.capture_table(
    tbl regclass,
    stream text default null,
    key_columns text[] default null,
    operations text[] default array['insert', 'update', 'delete'],
    condition text default null,
    columns text[] default null,
    exclude_columns text[] default null,
    changed_columns text[] default null,
    method text default 'trigger')
returns text language plpgsql as $$
declare
    v_schema  text;
    v_table   text;
    v_kind    "char";
    v_stream  text;
    v_keys    text[];
    v_ops     text[];
    v_op      text;
    v_key     text;
    v_capture integer;
    v_select  text;
    v_body    text;
    v_fn      text;
    v_p       integer;
    v_cond    text;
    v_filter  text;
    v_changed text;
    v_state   text;
    v_message text;
    v_r       text;
    v_n       text;
    v_o       text;
    v_names   text[];
    v_persistence "char";
    v_part    regclass;
    v_tree    regclass[];
begin
    select n.nspname, c.relname, c.relkind, c.relpersistence into v_schema, v_table, v_kind, v_persistence
    from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = tbl;
    if v_kind not in ('r', 'p') then
        raise exception 'pgferry: % is not a table; only tables can be captured', tbl using errcode = '42809';
    end if;
    if v_persistence = 't' then  -- gone with its session, its capture (and any backfill of it) left behind
        raise exception 'pgferry: % is a temporary table; only tables other sessions can see can be captured', tbl
            using errcode = '42809';
    end if;
    if v_schema = 'ferry' then
        raise exception 'pgferry: % is one of pgferry''s own tables; it cannot be captured', tbl using errcode = '42809',
            hint = 'Its state is read with pgferry status, trace and dlq; subscriptions, secrets and events never go into the log.';
    end if;
    v_stream := coalesce(stream, v_schema || '.' || v_table);
    perform ferry._check_stream(v_stream);
    if method is null or method not in ('trigger', 'wal') then
        raise exception 'pgferry: unknown capture method %; use trigger or wal', quote_nullable(method)
            using errcode = '22023';
    end if;
    if method = 'wal' then
        -- The table and, when partitioned, its partitions (which the WAL describes by their own
        -- REPLICA IDENTITY), the table first.
        v_tree := array[tbl] || array(select t.relid from pg_partition_tree(tbl) t where t.level > 0
                                      and t.relid in (select oid from pg_class where relkind in ('r', 'p'))
                                      order by t.level, t.relid);
        select t into v_part from unnest(v_tree) t join pg_class c on c.oid = t where c.relreplident = 'n' limit 1;
        if v_part is not null then
            raise exception 'pgferry: % has REPLICA IDENTITY NOTHING: once it is published, PostgreSQL refuses its UPDATEs and DELETEs', v_part
                using errcode = '55000',
                      hint = 'alter table ' || v_part::text || ' replica identity full (or default, with a primary key), '
                             'or capture it with method => ''trigger''.';
        end if;
        select t into v_part from unnest(v_tree) t join pg_class c on c.oid = t where c.relpersistence <> 'p' limit 1;
        if v_part is not null then  -- PostgreSQL's own refusal named a publication, not the cause
            raise exception 'pgferry: % is % table: its changes are not in the write-ahead log', v_part,
                            case when (select c.relpersistence from pg_class c where c.oid = v_part) = 'u'
                                 then 'an unlogged' else 'a temporary' end
                using errcode = '55000',
                      hint = 'Capture it with method => ''trigger'', or make it logged: alter table ' || v_part::text
                             || ' set logged.';
        end if;
        -- Inheritance children (not partitions) are published, and logged, as themselves: an
        -- UPDATE or DELETE through the parent of a child's rows reached the parent's triggers
        -- but not its WAL capture, without a word (outside probe).
        select i.inhrelid into v_part
        from pg_inherits i join pg_class p on p.oid = i.inhparent
        where i.inhparent = any (v_tree) and p.relkind = 'r'
        limit 1;
        if v_part is not null then
            raise exception 'pgferry: % has inheritance children (%, ...): the WAL gives their rows'' changes as theirs, '
                            'not its own, even when made through it', tbl, v_part::regclass
                using errcode = '55000',
                      hint = 'Capture it with method => ''trigger'': its statement triggers see the children''s '
                             'rows changed through it.';
        end if;
        -- The publication sends a partition's changes as its root's (publish_via_partition_root):
        -- a partition and a partitioned table above it, both from the WAL, left the partition's
        -- capture with nothing, without a word (outside probe).
        select c.relid into v_part
        from ferry.captures c
        where c.method = 'wal' and c.uncaptured_at is null and c.relid <> tbl
          and (c.relid = any (v_tree) or c.relid in (select a from pg_partition_ancestors(tbl) a));
        if v_part is not null then
            raise exception 'pgferry: % is captured from the WAL, and % is %: the WAL gives a partition''s changes '
                            'to the partitioned table above it only', v_part, tbl,
                            case when v_part = any (v_tree) then 'the partitioned table above it' else 'one of its partitions' end
                using errcode = '55000',
                      hint = format('Capture one of them from the WAL (ferry.uncapture_table(%L) first), or this one '
                                    'with method => ''trigger''.', v_part::text);
        end if;
        perform ferry._ensure_wal_slot();  -- first: a slot cannot be created after this transaction wrote
    end if;
    -- No writer of the table is half-way through a transaction from here on: a change is
    -- either before this capture (the old one's, and before any position taken below) or
    -- after it. A writer that had begun was caught by neither when only the new trigger's
    -- lock waited for it (outside probe: changes lost switching wal -> trigger).
    perform ferry._lock_for_capture(tbl);
    -- From the WAL to triggers: the trigger's events get their ids as they are written, the WAL's
    -- when the relay appends them. Its changes made so far go into the log first, or a row's stale
    -- value reached an ordered subscription after its next one (outside probe). The other way
    -- round needs no wait: trigger events before the switch have their ids already.
    if method = 'trigger' then
        perform ferry._wait_for_wal_capture(tbl);
    end if;

    if key_columns is null then
        select array_agg(a.attname::text order by k.ord) into v_keys
        from pg_index i
        cross join lateral unnest(i.indkey[0:i.indnkeyatts - 1]) with ordinality as k(attnum, ord)
        join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
        where i.indrelid = tbl and i.indisprimary;
        if v_keys is null then
            raise exception 'pgferry: table % has no primary key, so events would have no key', tbl
                using errcode = '42P10',
                      hint = 'Add a primary key, or name the key columns: ferry.capture_table(''' || tbl::text
                             || ''', key_columns => array[''col'']).';
        end if;
    else
        perform ferry._check_columns(tbl, key_columns, 'key_columns');
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

    -- Column choice and filters, all checked now rather than on a writer's first row.
    if columns is not null and exclude_columns is not null then
        raise exception 'pgferry: pass columns or exclude_columns, not both' using errcode = '22023',
            hint = 'columns keeps only the columns named; exclude_columns keeps all but those named.';
    end if;
    perform ferry._check_columns(tbl, columns, 'columns');
    perform ferry._check_columns(tbl, exclude_columns, 'exclude_columns');
    if not exists (select 1 from pg_attribute a where a.attrelid = tbl and a.attnum > 0 and not a.attisdropped
                   and a.attname <> all(coalesce(exclude_columns, '{}'))) then
        raise exception 'pgferry: exclude_columns leaves no column of % in the record', tbl using errcode = '22023',
            hint = 'Leave at least one column in, or capture with columns => array[...] instead.';
    end if;
    if key_columns && exclude_columns then
        raise exception 'pgferry: key_columns and exclude_columns both name %: the event key would carry what the record leaves out',
            (select string_agg(quote_ident(k), ', ') from unnest(key_columns) k where k = any (exclude_columns))
            using errcode = '22023',
                  hint = 'Key the events by other columns, or keep the column in the record.';
    end if;
    perform ferry._check_columns(tbl, changed_columns, 'changed_columns');
    if changed_columns is not null and 'update' <> all(v_ops) then
        raise exception 'pgferry: changed_columns applies to UPDATE, which this capture leaves out' using errcode = '22023',
            hint = 'Add ''update'' to operations, or leave changed_columns out.';
    end if;
    if changed_columns is not null then
        v_changed := (select string_agg(format('(od.o).%1$I is distinct from (nw.n).%1$I', c), ' or ' order by i)
                      from unnest(changed_columns) with ordinality x(c, i));
        begin  -- a type without equality (json, point, ...) cannot be compared: say so now
            execute format('select 1 from (select null::%1$s as o) od, (select null::%1$s as n) nw where %2$s limit 0',
                           tbl, v_changed);
        exception when others then
            get stacked diagnostics v_state = returned_sqlstate, v_message = message_text;
            raise exception 'pgferry: changed_columns cannot be compared: %', v_message using errcode = v_state,
                hint = 'Name columns whose type has an equality operator (cast json to jsonb, for example).';
        end;
        -- An array's or a composite's `=` plans, and fails on values: on the first UPDATE (outside probe).
        select format('%I is %s, and %s has no equality PostgreSQL can compare it with inside an array or a composite',
                      a.attname, format_type(a.atttypid, a.atttypmod), x.t)
        into v_message
        from unnest(changed_columns) c
        join pg_attribute a on a.attrelid = tbl and a.attname = c
        cross join lateral (select ferry._incomparable_type(a.atttypid) as t) x
        where x.t is not null
        limit 1;
        if v_message is not null then
            raise exception 'pgferry: changed_columns cannot be compared: %', v_message using errcode = '42883',
                hint = 'Leave that column out of changed_columns (or change its type: jsonb[] for json[], for example).';
        end if;
    end if;
    v_cond := ferry._capture_condition(tbl, condition);

    perform ferry.uncapture_table(tbl);
    insert into ferry.captures (relid, schema_name, table_name, stream, key_columns, operations,
                                condition, columns, exclude_columns, changed_columns, method)
    values (tbl, v_schema, v_table, v_stream, v_keys, v_ops,
            v_cond, capture_table.columns, capture_table.exclude_columns, capture_table.changed_columns,
            capture_table.method)
    returning id into v_capture;
    if method = 'wal' then
        execute format('alter publication %I add table only %s', (select w.publication from ferry.wal_slot w), tbl);
        -- And its partitions': the WAL carries a partition's old rows as the partition's
        -- replica identity says, whatever the partitioned table's (one left at the default gave
        -- UPDATEs without old_record and unchanged TOASTed values left out: outside probe).
        -- Partitions attached later keep theirs: docs/capture.md.
        for v_part in
            select t from unnest(v_tree) t join pg_class c on c.oid = t where c.relreplident = 'd'
        loop
            execute format('alter table %s replica identity full', v_part);
        end loop;
        -- A condition or changed_columns looks at the old row, which the WAL has whole only with
        -- REPLICA IDENTITY FULL: with an index's, a DELETE's old row is its key, and the events
        -- would differ from what triggers write (rows leaving the condition, deletes, unchanged
        -- columns taken for changed).
        if (v_cond is not null or capture_table.changed_columns is not null)
           and exists (select 1 from unnest(v_tree) t join pg_class c on c.oid = t where c.relreplident <> 'f') then
            raise exception 'pgferry: capturing % from the WAL with a condition or changed_columns needs its whole old rows, '
                            'and its REPLICA IDENTITY gives only their key', tbl
                using errcode = '55000',
                      hint = format('alter table %s replica identity full; or capture it with method => ''trigger''.', tbl);
        end if;
        -- A DELETE's old row is only the identity index's columns: without the key columns among
        -- them, every DELETE would reach readers with a null key (and so out of its key's order).
        select t into v_part
        from unnest(v_tree) t join pg_class c on c.oid = t join pg_index i on i.indrelid = t and i.indisreplident
        where c.relreplident = 'i'
          and exists (select 1 from unnest(v_keys) k
                      where k not in (select a.attname from pg_attribute a
                                      where a.attrelid = t and a.attnum = any (i.indkey[0:i.indnkeyatts - 1])))
        limit 1;
        if v_part is not null then
            raise exception 'pgferry: % has REPLICA IDENTITY USING INDEX %, which holds not all of its key columns (%): '
                            'its DELETEs would have no key', v_part,
                            (select i.indexrelid::regclass from pg_index i where i.indrelid = v_part and i.indisreplident),
                            array_to_string(v_keys, ', ')
                using errcode = '55000',
                      hint = format('alter table %s replica identity full (or using index on the key), or capture it '
                                    'with key_columns => that index''s columns.', v_part);
        end if;
        -- Changes from here on in the WAL are this capture's (migration 0022).
        update ferry.captures c set captured_lsn = pg_current_wal_insert_lsn() where c.id = v_capture;
        perform ferry._condition_outside_record_note(tbl, v_cond, capture_table.columns, capture_table.exclude_columns);
        return v_stream;
    end if;
    -- The generated statements name rows by the aliases r, n and o; a bare alias that is also a
    -- column name means the column (to_jsonb(r) of a table with a column r logged that column
    -- alone; (nw.n).* of one with a column n failed every UPDATE), so such a table gets the
    -- aliases pgferry_r, pgferry_n or pgferry_o instead (pgferry_pgferry_n when that is a column too).
    select array_agg(a.attname::text) into v_names
    from pg_attribute a where a.attrelid = tbl and a.attnum > 0 and not a.attisdropped;
    v_r := 'r';
    v_n := 'n';
    v_o := 'o';
    while v_r = any (v_names) loop v_r := 'pgferry_' || v_r; end loop;
    while v_n = any (v_names) loop v_n := 'pgferry_' || v_n; end loop;
    while v_o = any (v_names) loop v_o := 'pgferry_' || v_o; end loop;
    v_key := ferry._key_expression(v_capture, v_r);

    foreach v_op in array v_ops loop
        -- The SELECT producing (key, payload, op, old_payload) for this operation.
        -- The txid column defaults to pg_current_xact_id(); an AFTER trigger
        -- runs after its statement wrote rows, so the transaction id is taken
        -- before the partition pointer is read, as rotation requires. The
        -- UPDATE pairs old and new rows by position: transition tables are
        -- filled row by row in lockstep, so this holds even when the key changes.
        -- Each row goes through `select *` before it is taken whole: a whole
        -- row of a transition table keeps the slots of dropped columns, and
        -- taking fields of it failed once a column was dropped and one of
        -- another type added ("attribute 4 has wrong type", every UPDATE).
        -- Filters and column choice: without them, the statements of 0010 (an
        -- UPDATE's rows through `select *`, above).
        -- An UPDATE is captured when its old or its new row matches the
        -- condition (m), and one of changed_columns changed.
        v_filter := case when v_op = 'update' then concat_ws(' and ',
                             case when v_cond is not null then '(nw.m or od.m)' end,
                             case when v_changed is not null then '(' || v_changed || ')' end)
                         else v_cond end;
        v_select := case v_op
            when 'insert' then format(
                '%s, %s, ''I'', null::jsonb from pgferry_new %s', v_key, ferry._record_expression(v_capture, v_r), v_r)
            when 'delete' then format(
                '%s, %s, ''D'', null::jsonb from pgferry_old %s', v_key, ferry._record_expression(v_capture, v_r), v_r)
            else format(
                '%s, %s, ''U'', %s '
                'from (select row_number() over () as pos, %s%s from (select * from pgferry_new) %s) nw '
                'join (select row_number() over () as pos, %s%s from (select * from pgferry_old) %s) od using (pos), '
                'lateral (select (nw.n).*) %s',
                v_key, ferry._record_expression(v_capture, v_r), ferry._record_expression(v_capture, 'od.o'),
                case v_n when 'n' then 'n' else v_n || ' as n' end, ', ' || v_cond || ' as m', v_n,
                case v_o when 'o' then 'o' else v_o || ' as o' end, ', ' || v_cond || ' as m', v_o, v_r)
            end
            || coalesce(' where ' || nullif(v_filter, ''), '')
            || case v_op when 'update' then ' order by nw.pos' else '' end;
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
        -- Quoted as a literal (%L), so no text of a condition can end the body early.
        execute format('create function %s() returns trigger language plpgsql as %L', v_fn, format(
            E'%s\n'
             '            declare\n'
             '                v_part smallint := ferry._current_partition();\n'
             '            begin\n'
             '            %s    end if;\n'
             '                return null;\n'
             '            end ',
            -- a column of the condition named like v_part is the column
            case when v_cond is not null then E'\n            #variable_conflict use_column' else '' end,
            v_body));
        execute format('comment on function %s() is %L', v_fn,
                       format('pgferry: capture of %s %s into stream %s (generator %s)', v_op, tbl, v_stream,
                              ferry._capture_generator()));
        execute format('create trigger pgferry_capture_%s after %s on %s referencing %s for each statement execute function %s()',
                       v_op, v_op, tbl,
                       case v_op when 'insert' then 'new table as pgferry_new'
                                 when 'delete' then 'old table as pgferry_old'
                                 else 'old table as pgferry_old new table as pgferry_new' end,
                       v_fn);
    end loop;
    v_message := ferry._capture_note(tbl, 'trigger');
    if v_message is not null then
        raise notice 'pgferry: %', v_message;
    end if;
    perform ferry._condition_outside_record_note(tbl, v_cond, capture_table.columns, capture_table.exclude_columns);
    return v_stream;
end $$;
