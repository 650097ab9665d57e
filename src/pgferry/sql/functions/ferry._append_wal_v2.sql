-- ferry._append_wal_v2(from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz, relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[], lsns bigint[], xids bigint[], round_xids bigint[]) returns integer
--
-- Appends changes decoded from the WAL (capture/wal.py) to the log, as
-- capture_table's triggers would have written them, and moves
-- ferry.wal_slot.lsn from from_lsn to to_lsn in the same transaction: the
-- log then holds every change of the WAL-captured tables committed before
-- to_lsn, each once (exactly once: the relay confirms the slot only after
-- this commits, and skips transactions committed before lsn on restart).
--
-- One element per change, in commit order: relids the table, ops I, U, D
-- or T (TRUNCATE), rows the row as an object of column => text value (json
-- and jsonb columns as JSON; for D the old row), olds the old row of an
-- UPDATE when the table's replica identity logged one, missing the columns
-- of rows the WAL did not carry (an unchanged TOASTed value with no old
-- row to take it from: left out of the record rather than sent as null),
-- times the source transaction's commit time (the events' created_at), lsns
-- the change's own position in the WAL (as a number): it belongs to the
-- capture of its table whose [captured_lsn, uncaptured_lsn) holds it
-- (migration 0022), so a table switched to triggers, uncaptured or captured
-- again with other options still has the changes it made before, as they
-- were captured then; xids the source transaction's id as the WAL gives it
-- (32 bits, widened here: ferry._full_xid).
--
-- Each event is stored under its source transaction's id, so it belongs to
-- the batch of that transaction's commit, with the trigger-captured events
-- and publishes of the same transaction (migration 0028; the relay's ticker
-- waits for the append, ferry._tick_fenced) — unless a tick already
-- recorded sees that transaction committed: readers may have read that
-- batch, so the event is stored under this transaction's id and comes in
-- a later batch. xids NULL: every event under this transaction's id (what
-- ferry._append_wal, kept for older relays, does). A round of appends, one
-- transaction, may take several calls; the last one passes round_xids, the
-- source transactions of the whole round: under ferry._tick's lock, held
-- until commit, the events of those a tick has come to see committed since
-- they were appended move to this transaction's id, so no tick is recorded
-- between that decision and the commit. A round that stored or moved any
-- event under its own id records its id in ferry.wal_slot.late_txid
-- (migration 0030): the ticker's fence, if taken before the round
-- committed, sees later source transactions of the round (or of the next)
-- committed but not this one, and would put their changes in a batch
-- before the moved ones; ferry._tick_fenced takes such a fence again.
--
-- Values are converted by the input functions of the columns' types
-- (jsonb_to_record; a domain's base type's), so records equal to_jsonb of
-- the row; a table
-- whose columns are all numbers, booleans, text, uuid or json (the relay
-- writes those as to_jsonb would) skips that conversion when the capture
-- has no condition or changed_columns (the fast path, measured below).
-- Stored generated columns, which the WAL does not carry before PostgreSQL
-- 18, are computed again from the decoded row by their expressions (they
-- are immutable), so their values are the ones triggers see. Changes
-- a table had when no WAL capture of it held them are dropped; the
-- capture's condition, operations, changed_columns and column choice
-- apply; TRUNCATE is an event with no key and no record. Event ids are
-- drawn in change order, so readers see the source's order within and
-- across tables. Runs with xmloption = content, which reads back every xml
-- value (a fragment failed under a database's xmloption = document).
-- Returns the number of events appended.
--
-- Calls:   ferry._column_definitions, ferry._current_partition, ferry._full_xid, ferry._json_record_expression, ferry._key_expression,
--          ferry._record_expression
-- Reads:   ferry.captures, ferry.ticks
-- Writes:  ferry.events_0..2, ferry.wal_slot
-- Raises:  40001 (ferry.wal_slot.lsn is not from_lsn: another relay appended them)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay)

create or replace function ferry._append_wal_v2(
    from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz,
    relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[], lsns bigint[],
    xids bigint[], round_xids bigint[])
returns integer language plpgsql
-- XML values read back whatever the database's xmloption: content accepts documents too, and a
-- fragment (legal in an xml column) stopped all WAL capture under document (outside probe).
set xmloption = content
as $$
declare
    v_at    pg_lsn;
    v_ids   bigint[];
    v_txid  xid8;
    v_near  xid8;
    v_seen  pg_snapshot;
    v_txids xid8[];
    v_late  xid8[];
    v_moved boolean := false;
    v_part  smallint;
    c       ferry.captures;
    v_ops    text;
    v_fast   boolean;
    v_key    text;
    v_record text;
    v_old    text;
    v_from   text;
    v_filter text;
    v_generated text;
    v_gone  text[];
    v_defs  text;
    v_n     integer;
    v_total integer := 0;
begin
    select w.lsn into v_at from ferry.wal_slot w for update;
    if v_at is distinct from from_lsn then
        raise exception 'pgferry: WAL capture is at % in the log, not %: another relay appended these changes', v_at, from_lsn
            using errcode = '40001';
    end if;
    if cardinality(ops) > 0 then
        -- Ids in change order (the sequence hands them out increasing), the
        -- txid before the partition pointer, as rotation requires.
        v_ids := array(select nextval('ferry.event_id_seq') from generate_series(1, cardinality(ops)) order by 1);
        v_txid := pg_current_xact_id();
        v_part := ferry._current_partition();
        -- Each change under its source transaction's id (widened from the WAL's 32 bits), or
        -- this one's when a recorded tick already sees it.
        v_near := pg_snapshot_xmax(pg_current_snapshot());
        select t.snapshot into v_seen from ferry.ticks t order by t.id desc limit 1;
        if xids is null then
            v_txids := array_fill(v_txid, array[cardinality(ops)]);
        else
            v_txids := array(select case when pg_visible_in_snapshot(f.source, v_seen) then v_txid else f.source end
                             from unnest(xids) with ordinality x(xid, i)
                             cross join lateral (select ferry._full_xid(x.xid, v_near) as source) f
                             order by x.i);
        end if;
        v_moved := v_txid = any (v_txids);
        -- Every WAL capture of the tables that may own one of the changes: current, or ended
        -- after the first of them (the statement below keeps each change to its own).
        for c in select * from ferry.captures cc
                 where cc.method = 'wal' and cc.relid = any(relids)
                   and (cc.uncaptured_at is null
                        or cc.uncaptured_lsn - '0/0'::pg_lsn > (select min(l) from unnest(lsns) l)) loop
            v_ops := array_to_string(array(select case o when 'insert' then 'I' when 'update' then 'U' else 'D' end
                                           from unnest(c.operations) o), '');
            -- The fast path: every column of a type whose to_jsonb form the relay wrote as it is
            -- (numbers, booleans, text, uuid, json: capture/wal.py's NUMBER_TYPES, BOOL and
            -- JSON_TYPES, the rest as JSON strings), no condition and no changed_columns to
            -- evaluate over a typed row, and a key whose text equals its JSON value's (not float,
            -- json or char(n): its ::text drops the padding the row object keeps): the row
            -- object is the record, with no conversion through the table's row type.
            -- Stored generated columns: the WAL does not carry them (pgoutput before PostgreSQL
            -- 18), so they are computed again from the row, by their own expressions.
            select string_agg(format('jsonb_build_object(%L, %s)', a.attname, pg_get_expr(d.adbin, d.adrelid)),
                              ' || ' order by a.attnum)
            into v_generated
            from pg_attribute a join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
            where a.attrelid = c.relid and a.attnum > 0 and not a.attisdropped and a.attgenerated = 's';
            -- A table dropped before its changes were appended has no columns to type them by:
            -- they are written from the decoded rows, as on the fast path (its condition cannot be
            -- evaluated, so it is not; changed_columns is compared in the rows). Typed by a bare
            -- oid, the statement failed and held every later change of every table (outside probe).
            v_defs := ferry._column_definitions(c.relid);
            v_fast := v_defs is null or c.condition is null and c.changed_columns is null and v_generated is null
                and not exists (select 1 from pg_attribute a where a.attrelid = c.relid and a.attnum > 0
                                and not a.attisdropped and a.atttypid not in (21, 23, 20, 700, 701, 1700, 16, 25, 1043,
                                                                              1042, 19, 2950, 114, 3802))
                and not exists (select 1 from pg_attribute a where a.attrelid = c.relid
                                and a.attname = any(c.key_columns) and a.atttypid in (700, 701, 114, 3802, 1042));
            if v_fast then
                v_key := case when cardinality(c.key_columns) = 1 then format('(x.n->>%L)', c.key_columns[1])
                              else format('jsonb_build_array(%s)::text', (select string_agg(format('x.n->%L', k), ', ')
                                                                         from unnest(c.key_columns) k)) end;
                v_record := ferry._json_record_expression(c.id, 'x.n');
                v_old := ferry._json_record_expression(c.id, 'x.o');
                v_from := '';
                v_filter := 'true';
                v_gone := c.changed_columns;  -- no typed rows: changed_columns compared in the decoded ones
            else
                v_key := ferry._key_expression(c.id, 'r');
                -- Columns the table no longer has (dropped or renamed since; the change may be
                -- older than that): a column list naming one is applied to the row object, and
                -- changed_columns compares such a one in the decoded rows (which hold it when
                -- the change is older than the drop). Named by type, they failed the append, and
                -- held every later change of every table (outside probe).
                select array_agg(n) into v_gone
                from unnest(coalesce(c.columns, '{}') || coalesce(c.changed_columns, '{}')) n
                where not exists (select 1 from pg_attribute a where a.attrelid = c.relid and a.attname = n
                                  and a.attnum > 0 and not a.attisdropped);
                if v_gone is null then
                    v_record := ferry._record_expression(c.id, 'r');
                    v_old := ferry._record_expression(c.id, 'od');
                else
                    v_record := ferry._json_record_expression(c.id, 'to_jsonb(r.*)');
                    v_old := ferry._json_record_expression(c.id, 'to_jsonb(od.*)');
                end if;
                -- The decoded rows typed by the table's columns, domains as their base types
                -- (ferry._column_definitions says why): r the row, od the old row of an UPDATE.
                -- The generated columns' expressions see the row's columns by their bare names
                -- (the innermost scope: the decoded row, s).
                v_from := format('left join lateral jsonb_to_record(x.n%2$s) as r(%1$s) on true '
                                 'left join lateral jsonb_to_record(x.o%3$s) as od(%1$s) on true ', v_defs,
                                 ' || (select ' || v_generated || format(' from jsonb_to_record(x.n) as s(%s))', v_defs),
                                 ' || (select ' || v_generated || format(' from jsonb_to_record(x.o) as s(%s))', v_defs));
                -- The condition over the row by name, in a scope of its own (bare names are the
                -- table's columns, not this statement's); an UPDATE when its old or new row matches.
                v_filter := case when c.condition is null then 'true'
                                 else format('(select (%1$s) from (select r.*) s) or (x.op = ''U'' and x.o is not null '
                                             'and (select (%1$s) from (select od.*) s))', c.condition) end;
            end if;
            v_filter := v_filter
                     || case when c.changed_columns is null then ''
                             else format(') and (x.op <> ''U'' or x.o is null or %s',
                                         (select string_agg(case when col = any (v_gone)
                                                                 then format('(x.o -> %1$L) is distinct from (x.n -> %1$L)', col)
                                                                 else format('od.%1$I is distinct from r.%1$I', col) end,
                                                            ' or ')
                                          from unnest(c.changed_columns) col)) end;
            execute format(
                '/* pgferry capture %3$s */ '  -- names the capture in the context of an error (capture/wal.py)
                'insert into ferry.events_%1$s (id, part, txid, stream, capture, key, payload, op, old_payload, created_at) '
                'select x.id, %1$s, x.txid, %2$L, %3$s, '
                '       case when x.op = ''T'' then null else %4$s end, '
                '       case when x.op = ''T'' then ''{}''::jsonb when x.missing is null then %5$s '
                '            else %5$s - array(select jsonb_array_elements_text(x.missing)) end, '
                '       x.op, case when x.op = ''U'' and x.o is not null then %6$s end, x.at '
                'from unnest($1, $2, $3, $4, $5, $6, $7, $8, $9) x(id, relid, op, n, o, missing, at, lsn, txid) %7$s'
                'where x.relid = %8$s and x.lsn >= %11$s and x.lsn < %12$s '
                '  and (x.op = ''T'' or (strpos(%9$L, x.op) > 0 and (%10$s))) '
                'order by x.id',
                v_part, c.stream, c.id, v_key, v_record, v_old, v_from, c.relid, v_ops, v_filter,
                coalesce(c.captured_lsn - '0/0'::pg_lsn, 0), coalesce(c.uncaptured_lsn - '0/0'::pg_lsn, 9223372036854775807))
            using v_ids, relids, ops, rows, olds, missing, times, lsns, v_txids;
            get diagnostics v_n = row_count;
            v_total := v_total + v_n;
        end loop;
    end if;
    if round_xids is not null then
        -- The end of a round: from here until commit no tick is recorded. Events of a source
        -- transaction that a tick recorded since they were appended sees committed would be in no
        -- batch (readers passed it): they go under this transaction's id, into a later one.
        perform pg_advisory_xact_lock(28774, 4);  -- ferry._tick's
        v_txid := pg_current_xact_id();
        v_near := pg_snapshot_xmax(pg_current_snapshot());
        select t.snapshot into v_seen from ferry.ticks t order by t.id desc limit 1;
        v_late := array(select f.source
                        from unnest(round_xids) x(xid)
                        cross join lateral (select ferry._full_xid(x.xid, v_near) as source) f
                        where pg_visible_in_snapshot(f.source, v_seen));
        if cardinality(v_late) > 0 then
            update ferry.events e set txid = v_txid where e.txid = any (v_late) and e.xmin = v_txid::xid;
            v_moved := v_moved or found;
        end if;
    end if;
    update ferry.wal_slot w
    set lsn = greatest(w.lsn, to_lsn), committed_at = coalesce(_append_wal_v2.committed_at, w.committed_at), caught_up_at = now(),
        late_txid = case when v_moved then v_txid else w.late_txid end;
    return v_total;
end $$;
