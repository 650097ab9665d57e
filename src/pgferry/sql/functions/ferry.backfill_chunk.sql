-- ferry.backfill_chunk(backfill bigint) returns table (state text, rows_done bigint, rows_estimate bigint, chunk_rows integer)
--
-- Does the next chunk of a running backfill, in the caller's transaction,
-- which should hold nothing else and commit right after: a chunk's rows stay
-- share-locked until then. Picks the chunk_size-th primary key after
-- last_key (matching the condition), then in one INSERT ... SELECT ... FOR
-- SHARE writes a READ event for every row in (last_key, that key], and
-- records that key as last_key: progress commits with the events, so a
-- runner killed at any point resumes after the last chunk that committed.
-- Fewer rows than chunk_size left: the rest is read and the backfill is
-- done. Migration 0013 proves the order against live writes.
-- The event of a row is built in this one function: key as the capture's
-- key expression, record as `v_record` below (where a capture's column
-- choice belongs), type READ from op 'R' (ferry._envelope).
-- Returns one row: the backfill's state after the chunk ('busy' when
-- another runner holds it right now: try again shortly), rows done so far,
-- the estimate of the total and the rows this chunk wrote. An error while
-- reading the table (dropped column, uncaptured table, privileges) marks
-- the backfill failed with the message as reason, and is not raised;
-- transient errors (deadlock, serialization, cancel, resources) are raised
-- and leave it running.
-- The last key is stored as text and read back by whichever session runs
-- the next chunk: both under the settings of ferry._set_portable_output
-- (the SET clauses below; they end with the call): a date key stored under
-- DateStyle 'SQL, DMY' was read back as another day (rows skipped), a float
-- key under extra_float_digits 0 never moved on. The same settings shape
-- the READ events' keys and records: a bytea key under bytea_output
-- 'escape' came out as another key than the row's WAL-captured UPDATE.
-- A backfill whose primary key changed since its last chunk (other columns,
-- renamed, in another order or of another type: last_key_columns, migration
-- 0033) fails: the stored key no longer says where it was; read as NULL it
-- ended the backfill as done, and compared in a new order or type it
-- skipped rows. One whose capture now writes into a
-- stream its target does not read fails too (its READ events would reach
-- nobody), and so does one for every reader whose capture now writes into
-- another stream than the one its first chunks went to (the table would be
-- split over two streams, whole in neither). And one with a condition runs only as the role that wrote it: the
-- condition is SQL, and run by another role (an operator resuming it) it
-- would run with that role's rights.
-- A table with inheritance children is read ONLY: its own rows (the
-- children's are theirs, backfilled with them; docs/backfills.md).
--
-- Calls:   ferry._backfill_key_literal, ferry._current_partition, ferry._key_expression, ferry._record_expression
-- Reads:   ferry.backfills, ferry.captures, pg_index, pg_attribute, the backfilled table
-- Writes:  ferry.backfills, ferry.events_0..2
-- Raises:  42704, 42501 (a condition written by another role), and transient errors (08, 40, 53, 57, 55P03: a
--          row locked for over a second, set lock_timeout below)
-- Runs as: the caller (SECURITY INVOKER): the table and condition are read with the caller's rights
-- Callers: PUBLIC (the default)

create or replace function ferry.backfill_chunk(backfill bigint)
returns table (state text, rows_done bigint, rows_estimate bigint, chunk_rows integer)
language plpgsql
set datestyle = 'ISO, YMD' set intervalstyle = 'postgres' set extra_float_digits = 3 set bytea_output = 'hex'  -- ferry._set_portable_output's
-- A chunk waiting on one row's lock held its share locks on every row before it meanwhile: one
-- idle transaction made writers of up to chunk_size other rows wait as long (outside probe: 23 s).
-- The runner tries a chunk that timed out again after a pause (55P03 is transient).
set lock_timeout = '1s'
as $$
declare
    b         ferry.backfills;
    v_capture ferry.captures;
    v_cols    text;   -- r.a, r.b: the primary key, in index order
    v_object  text;   -- 'a', r.a::text, 'b', r.b::text: the primary key as a JSON object
    v_names   text[]; -- the primary key's columns
    v_types   text[]; -- and their types
    v_from    text;
    v_shape   text[]; -- both: '"name" type', in the key's order (backfills.last_key_columns)
    v_where   text;
    v_upper   jsonb;
    v_key     text;
    v_record  text;
    v_txid    xid8;
    v_part    smallint;
    v_n       integer := 0;
    v_sqlstate text;
begin
    select * into b from ferry.backfills f where f.id = backfill_chunk.backfill for update skip locked;
    if not found then
        if not exists (select 1 from ferry.backfills f where f.id = backfill_chunk.backfill) then
            raise exception 'pgferry: backfill % does not exist', backfill using errcode = '42704',
                  hint = 'See `pgferry backfill --list`.';
        end if;
        return query select 'busy'::text, null::bigint, null::bigint, 0;
        return;
    end if;
    if b.state <> 'running' then
        return query select b.state, b.rows_done, b.rows_estimate, 0;
        return;
    end if;
    if b.condition is not null and b.created_by <> current_user then
        raise exception 'pgferry: backfill % has a condition written by role %, so only that role runs it '
                        '(run as %, the condition would run with that role''s rights)', b.id, b.created_by, current_user
            using errcode = '42501',
                  hint = format('Run it as %s (its credentials in the database URL, or SET ROLE %s), or cancel it '
                                'and start one of your own.', b.created_by, b.created_by);
    end if;

    begin
        select * into v_capture from ferry.captures c where c.relid = b.relid and c.uncaptured_at is null;
        if not found then
            raise exception 'table %.% is no longer captured', quote_ident(b.schema_name), quote_ident(b.table_name)
                using errcode = '55000';
        end if;
        select array_agg(a.attname::text order by k.ord), array_agg(format_type(a.atttypid, a.atttypmod) order by k.ord)
          into v_names, v_types
        from pg_index i
        cross join lateral unnest(i.indkey[0:i.indnkeyatts - 1]) with ordinality as k(attnum, ord)
        join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
        where i.indrelid = b.relid and i.indisprimary;
        -- The key's values in their text form, which their type reads back exactly: as JSON, an
        -- array, a composite or a jsonb string key did not (`[2, 3]` is no int[] literal).
        select string_agg(format('r.%I', n), ', ' order by o), string_agg(format('%L, r.%I::text', n, n), ', ' order by o)
          into v_cols, v_object
        from unnest(v_names) with ordinality x(n, o);
        if v_cols is null then
            raise exception 'table %.% has no primary key any more', quote_ident(b.schema_name), quote_ident(b.table_name)
                using errcode = '42P10';
        end if;
        v_shape := array(select format('%I %s', n, t) from unnest(v_names, v_types) x(n, t));
        if b.last_key is not null
           and (b.last_key_columns is distinct from v_shape
                and (b.last_key_columns is not null  -- recorded before 0033: the names alone
                     or array(select k from jsonb_object_keys(b.last_key) k order by k)
                        <> array(select n from unnest(v_names) n order by n))) then
            raise exception 'the primary key of %.% changed since the backfill began (its last chunk ended at %); '
                            'start a new backfill', quote_ident(b.schema_name), quote_ident(b.table_name), b.last_key
                using errcode = '55000';
        end if;
        if b.target is not null and not exists (
            select 1 from ferry.consumers c where c.name = b.target or 'webhook:' || c.subscription = b.target) then
            raise exception 'the backfill''s target % is gone (its subscription or consumer was removed)', b.target
                using errcode = '55000';
        end if;
        if b.target is not null and not exists (
            select 1 from ferry.consumers c
            where (c.name = b.target or 'webhook:' || c.subscription = b.target)
              and (c.streams is null or v_capture.stream = any (c.streams))) then
            raise exception '%.% is now captured into stream %, which % does not read; start a new '
                            'backfill for a reader of that stream', quote_ident(b.schema_name),
                            quote_ident(b.table_name), quote_literal(v_capture.stream), b.target
                using errcode = '55000';
        end if;
        if row_security_active(b.relid) then  -- it read only the rows the policies showed, and said done
            raise exception 'row-level security hides rows of %.% from role %, so a backfill would miss them; run it '
                            'as the table''s owner (without FORCE ROW LEVEL SECURITY) or a role with BYPASSRLS',
                            quote_ident(b.schema_name), quote_ident(b.table_name), current_user
                using errcode = '42501';
        end if;
        if b.target is null and b.last_key is not null
           and v_capture.stream is distinct from (select c.stream from ferry.captures c where c.id = b.capture) then
            raise exception '%.% is now captured into stream %, not % where the rows up to % went; start a new '
                            'backfill (from the first row) for the new stream', quote_ident(b.schema_name),
                            quote_ident(b.table_name), quote_literal(v_capture.stream),
                            quote_literal((select c.stream from ferry.captures c where c.id = b.capture)), b.last_key
                using errcode = '55000';
        end if;
        v_where := case when b.last_key is null then 'true'
                        else format('(%s) > (%s)', v_cols, ferry._backfill_key_literal(b.last_key, v_names, v_types)) end
                   || case when b.condition is null then '' else format(' and (%s)', b.condition) end;

        -- The event of a row r: as capture_table builds it (the capture's key and column choice),
        -- and only for rows its condition keeps.
        v_key := ferry._key_expression(v_capture.id, 'r');
        v_record := ferry._record_expression(v_capture.id, 'r');
        -- The table's own rows, not its inheritance children's: they are the children's, keyed in
        -- their own key (they collided with the parent's: two READs keyed 1; outside probe), and
        -- backfilled with the children. A partitioned table's rows are its partitions'.
        v_from := case when (select c.relkind from pg_class c where c.oid = b.relid) = 'r'
                       then 'only ' else '' end || b.relid::regclass::text;
        if v_capture.condition is not null then
            v_where := v_where || format(' and (%s)', v_capture.condition);
        end if;

        -- 1. The chunk's last key, as the snapshot of this statement orders them (no lock).
        execute format('select jsonb_build_object(%s) from %s r where %s order by %s offset %s limit 1',
                       v_object, v_from, v_where, v_cols, b.chunk_size - 1)
            into v_upper;
        -- 2. Its rows, share-locked as they are read, as READ events. The txid is taken before the
        -- partition pointer is read, as rotation requires (it is this transaction's: the row lock above).
        v_txid := pg_current_xact_id();
        v_part := ferry._current_partition();
        execute format(
            'insert into ferry.events_%s (part, txid, stream, capture, key, payload, op, target) '
            'select %s, %L::xid8, %L, %s, %s, %s, ''R'', %L from %s r where %s%s order by %s for share of r',
            v_part, v_part, v_txid, v_capture.stream, v_capture.id, v_key, v_record, b.target,
            v_from, v_where,
            case when v_upper is null then ''
                 else format(' and (%s) <= (%s)', v_cols, ferry._backfill_key_literal(v_upper, v_names, v_types)) end,
            v_cols);
        get diagnostics v_n = row_count;
    exception when others then
        v_sqlstate := sqlstate;
        if left(v_sqlstate, 2) in ('08', '40', '53', '57') or v_sqlstate = '55P03' then  -- 55P03: lock_timeout
            raise;
        end if;
        update ferry.backfills f
        set state = 'failed', reason = format('%s (SQLSTATE %s)', sqlerrm, v_sqlstate),
            updated_at = clock_timestamp(), finished_at = clock_timestamp()
        where f.id = b.id
        returning * into b;
        return query select b.state, b.rows_done, b.rows_estimate, 0;
        return;
    end;

    update ferry.backfills f
    set last_key = coalesce(v_upper, f.last_key),
        last_key_columns = case when v_upper is null then f.last_key_columns else v_shape end,
        rows_done = f.rows_done + v_n,
        chunks_done = f.chunks_done + 1,
        state = case when v_upper is null then 'done' else f.state end,
        updated_at = clock_timestamp(),
        finished_at = case when v_upper is null then clock_timestamp() end
    where f.id = b.id
    returning * into b;
    return query select b.state, b.rows_done, b.rows_estimate, v_n;
end $$;
