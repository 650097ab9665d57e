-- ferry._append_wal(from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz, relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[]) returns integer
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
-- times the source transaction's commit time (the events' created_at).
-- Values are converted by the columns' own input functions
-- (jsonb_populate_record), so records equal to_jsonb of the row. Changes
-- of tables no longer captured with method 'wal' are dropped; the
-- capture's condition, operations, changed_columns and column choice
-- apply; TRUNCATE is an event with no key and no record. Event ids are
-- drawn in change order, so readers see the source's order within and
-- across tables.
-- Returns the number of events appended.
--
-- Calls:   ferry._current_partition, ferry._key_expression, ferry._record_expression
-- Reads:   ferry.captures
-- Writes:  ferry.events_0..2, ferry.wal_slot
-- Raises:  40001 (ferry.wal_slot.lsn is not from_lsn: another relay appended them)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay)

create or replace function ferry._append_wal(
    from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz,
    relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[])
returns integer language plpgsql as $$
declare
    v_at    pg_lsn;
    v_ids   bigint[];
    v_txid  xid8;
    v_part  smallint;
    c       ferry.captures;
    v_cond  text;
    v_ops   text;
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
        for c in select * from ferry.captures cc
                 where cc.method = 'wal' and cc.uncaptured_at is null and cc.relid = any(relids) loop
            v_ops := array_to_string(array(select case o when 'insert' then 'I' when 'update' then 'U' else 'D' end
                                           from unnest(c.operations) o), '');
            -- The condition over the row by name, in a scope of its own (bare names
            -- are the table's columns, not this statement's).
            v_cond := case when c.condition is null then 'true'
                           else format('(select (%s) from (select r.*) s)', c.condition) end;
            execute format(
                'insert into ferry.events_%1$s (id, part, txid, stream, capture, key, payload, op, old_payload, created_at) '
                'select x.id, %1$s, %2$L::xid8, %3$L, %4$s, '
                '       case when x.op = ''T'' then null else %5$s end, '
                '       case when x.op = ''T'' then ''{}''::jsonb when x.missing is null then %6$s '
                '            else %6$s - array(select jsonb_array_elements_text(x.missing)) end, '
                '       x.op, case when x.op = ''U'' and x.o is not null then %7$s end, x.at '
                'from unnest($1, $2, $3, $4, $5, $6, $7) x(id, relid, op, n, o, missing, at) '
                'cross join lateral jsonb_populate_record(null::%8$s, x.n) r '
                'cross join lateral (select case when x.o is not null then jsonb_populate_record(null::%8$s, x.o) end as o) od '
                'where x.relid = %9$s and (x.op = ''T'' or (strpos(%10$L, x.op) > 0 and (%11$s%12$s%13$s))) '
                'order by x.id',
                v_part, v_txid, c.stream, c.id,
                ferry._key_expression(c.id, 'r'), ferry._record_expression(c.id, 'r'),
                ferry._record_expression(c.id, 'od.o'),
                c.relid::regclass, c.relid, v_ops,
                v_cond,
                case when c.condition is null then ''
                     else format(' or (x.op = ''U'' and x.o is not null and (select (%s) from (select (od.o).*) s))',
                                 c.condition) end,
                case when c.changed_columns is null then ''
                     else format(') and (x.op <> ''U'' or x.o is null or %s',
                                 (select string_agg(format('(od.o).%1$I is distinct from r.%1$I', col), ' or ')
                                  from unnest(c.changed_columns) col)) end)
            using v_ids, relids, ops, rows, olds, missing, times;
            get diagnostics v_n = row_count;
            v_total := v_total + v_n;
        end loop;
    end if;
    update ferry.wal_slot w
    set lsn = greatest(w.lsn, to_lsn), committed_at = coalesce(_append_wal.committed_at, w.committed_at), caught_up_at = now();
    return v_total;
end $$;
