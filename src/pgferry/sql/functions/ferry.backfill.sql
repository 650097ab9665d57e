-- ferry.backfill(tbl regclass, subscription text default null, consumer text default null, condition text default null, chunk_size integer default 2000) returns bigint
--
-- Starts a backfill of a captured table: every row (matching condition)
-- will become one READ event of the capture's stream, in primary-key
-- order, written by ferry.backfill_chunk in one short transaction per
-- chunk (migration 0013 says why that is consistent with live writes).
-- This only records it, in state running; a runner drives it
-- (`pgferry backfill`, or SQL calling ferry.backfill_chunk until it is done).
-- tbl: a captured table with a primary key; subscription or consumer (at
-- most one): the only reader of the events, which must read the table's
-- stream (neither: every reader); condition: a boolean SQL expression over
-- the table's columns (not `where`: a reserved word cannot name an
-- argument), checked and stored deparsed (ferry._backfill_condition); chunk_size: rows per chunk transaction (the
-- default, 2000, is docs/backfills.md's measured trade-off).
-- Refused while another backfill of tbl for the same target (the same
-- subscription, the same consumer, or every reader) is running or paused:
-- both would send every row; the message names it, to resume or cancel.
-- Returns the backfill's id.
--
-- Calls:   ferry._backfill_condition
-- Reads:   ferry.captures, ferry.consumers, ferry.subscriptions, pg_index, the planner's estimate of tbl's rows
-- Writes:  ferry.backfills
-- Raises:  22004 (tbl NULL), 22023, 42501 (no SELECT, or no UPDATE on any column: FOR SHARE needs it; rows hidden by row-level security), 42704, 42809 (a view, a materialized view, a ferry table), 42P10, 55000, and the SQLSTATE of an invalid condition (42601, 42703, 42804, ...)
-- Runs as: the caller (SECURITY INVOKER): the condition runs with the caller's rights
-- Callers: PUBLIC (the default); the caller must be able to read tbl

create or replace function ferry.backfill(
    tbl regclass,
    subscription text default null,
    consumer text default null,
    condition text default null,
    chunk_size integer default 2000)
returns bigint language plpgsql as $$
declare
    v_capture ferry.captures;
    v_target  text;
    v_streams text[];
    v_found   boolean;
    v_condition text;
    v_id      bigint;
    v_plan    json;
    v_state   text;
begin
    if tbl is null then  -- its message was "RAISE statement option cannot be null"
        raise exception 'pgferry: ferry.backfill needs a table, not NULL' using errcode = '22004',
            hint = 'select ferry.backfill(''schema.table'');';
    end if;
    -- A view, a materialized view, pgferry's own table: never captured, and not because nobody did.
    if (select c.relkind from pg_class c where c.oid = tbl) not in ('r', 'p') then
        raise exception 'pgferry: % is not a table: only tables can be captured, and so backfilled', tbl
            using errcode = '42809', hint = 'Backfill the table(s) it reads from, captured.';
    end if;
    if (select n.nspname from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = tbl) = 'ferry' then
        raise exception 'pgferry: % is one of pgferry''s own tables: it cannot be captured, nor backfilled', tbl
            using errcode = '42809',
                  hint = 'Its state is read with pgferry status, trace and dlq; subscriptions, secrets and events never go into the log.';
    end if;
    select * into v_capture from ferry.captures c where c.relid = tbl and c.uncaptured_at is null;
    if not found then
        raise exception 'pgferry: table % is not captured, so a backfill would have no stream to write to', tbl
            using errcode = '55000',
                  hint = 'Capture it first: select ferry.capture_table(''' || tbl::text || ''');';
    end if;
    if not exists (select 1 from pg_index i where i.indrelid = tbl and i.indisprimary) then
        raise exception 'pgferry: table % has no primary key; a backfill reads it in primary-key order', tbl
            using errcode = '42P10', hint = 'Add a primary key to the table.';
    end if;
    -- Capture sees every row (transition tables and the WAL know no policies); a backfill sees what
    -- the policies show its role: it read 0 of 3,000 rows and said done (outside probe).
    if row_security_active(tbl) then
        raise exception 'pgferry: row-level security hides rows of % from role %, so a backfill would miss them', tbl,
                        current_user
            using errcode = '42501',
                  hint = 'Run it as the table''s owner (without FORCE ROW LEVEL SECURITY) or as a role with BYPASSRLS.';
    end if;
    -- A chunk reads its rows FOR SHARE (migration 0013), which PostgreSQL allows only with UPDATE
    -- on a column of the table as well: without it every chunk failed with "permission denied".
    if not has_table_privilege(tbl, 'SELECT') or not has_any_column_privilege(tbl, 'UPDATE') then
        raise exception 'pgferry: role % may not backfill %: a backfill reads its rows with SELECT ... FOR SHARE, '
                        'which needs the SELECT privilege and UPDATE on at least one column', current_user, tbl
            using errcode = '42501',
                  hint = format('grant select, update (%s) on %s to %s;',
                                (select quote_ident(a.attname) from pg_attribute a
                                 where a.attrelid = tbl and a.attnum > 0 and not a.attisdropped order by a.attnum limit 1),
                                tbl, quote_ident(current_user));
    end if;
    if chunk_size is null or chunk_size < 1 or chunk_size > 1000000 then
        raise exception 'pgferry: chunk_size must be between 1 and 1000000, not %', coalesce(chunk_size::text, 'NULL')
            using errcode = '22023', hint = 'Leave it out for the default of 2000.';
    end if;
    if subscription is not null and consumer is not null then
        raise exception 'pgferry: a backfill is for one subscription or one consumer, not both'
            using errcode = '22023', hint = 'Give subscription or consumer, or neither for every reader.';
    end if;
    if subscription is not null then
        select s.streams into v_streams from ferry.subscriptions s where s.name = backfill.subscription;
        v_found := found;
        v_target := 'webhook:' || subscription;
    elsif consumer is not null then
        select c.streams into v_streams from ferry.consumers c where c.name = backfill.consumer;
        v_found := found;
        v_streams := coalesce(v_streams, array[v_capture.stream]);  -- NULL streams: reads every stream
        v_target := consumer;
    end if;
    if v_target is not null and not v_found then
        raise exception 'pgferry: % % does not exist',
            case when subscription is not null then 'subscription' else 'consumer' end,
            quote_literal(coalesce(subscription, consumer))
            using errcode = '42704',
                  hint = case when subscription is not null then 'See `pgferry subscription list`.'
                              else 'See `pgferry consumers`, or register it first.' end;
    end if;
    if v_target is not null and not v_capture.stream = any (v_streams) then
        raise exception 'pgferry: % does not read stream %, where % is captured, so it would receive nothing',
            quote_literal(coalesce(subscription, consumer)), quote_literal(v_capture.stream), tbl
            using errcode = '22023', hint = 'Add the stream to it, or backfill for a reader of that stream.';
    end if;
    v_condition := ferry._backfill_condition(tbl, condition);
    -- One backfill of a table per target at a time: two sent every row twice to the same readers
    -- (outside probe: 6,000 READs of 3,000 rows). Serialized per table, so that two starting at
    -- once see each other. Another target (or the same one after this one ends) is fine.
    perform pg_advisory_xact_lock(hashtextextended('pgferry backfill ' || tbl::oid::text, 0));
    select b.id, b.state into v_id, v_state
    from ferry.backfills b
    where b.relid = tbl and b.state in ('running', 'paused') and b.target is not distinct from v_target
    order by b.id limit 1;
    if v_id is not null then
        raise exception 'pgferry: backfill % of % for % is % already: another would send its rows to the same readers '
                        'again', v_id, tbl, coalesce(quote_literal(coalesce(subscription, consumer)), 'every reader'),
                        v_state
            using errcode = '55000',
                  hint = format('Let it finish; if its runner is gone, resume it: pgferry backfill --resume %s '
                                '(in SQL, ferry.backfill_resume and ferry.backfill_chunk); or cancel it: pgferry '
                                'backfill --cancel %s, and start again.', v_id, v_id);
    end if;

    -- The planner's estimate of the table's rows (no scan): unlike pg_class.reltuples it exists
    -- for a table never analyzed (from its size; reltuples is -1 then, and the progress bar had
    -- no total) and for a partitioned one. Of the whole table, conditions or not: an upper
    -- bound. The planner's guess for a condition can be far too low (a tenth of the rows of
    -- `id % 2 = 0`), and a bar at 100% for most of the run says less than one that ends early.
    execute format('explain (format json) select 1 from %s%s', case when (select c.relkind from pg_class c
                                                                        where c.oid = tbl) = 'r' then 'only ' end, tbl)
        into v_plan;
    begin
        insert into ferry.backfills (capture, relid, schema_name, table_name, target, condition, chunk_size,
                                     rows_estimate)
        values (v_capture.id, tbl, v_capture.schema_name, v_capture.table_name, v_target, v_condition,
                backfill.chunk_size, round((v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint)
        returning id into v_id;
    exception when unique_violation or serialization_failure then
        -- backfills_one_active_idx (migration 0041): one started at the same time, by a caller whose
        -- snapshot (REPEATABLE READ) is older than the lock above, so the look did not see it
        raise exception 'pgferry: another backfill of % for % started at the same time: another would send its rows '
                        'to the same readers again', tbl, coalesce(quote_literal(coalesce(subscription, consumer)),
                                                              'every reader')
            using errcode = '55000', hint = 'See `pgferry backfill --list`; let it finish, or cancel it and start again.';
    end;
    return v_id;
end $$;
