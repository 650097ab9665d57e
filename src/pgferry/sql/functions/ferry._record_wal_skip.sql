-- ferry._record_wal_skip(lsns pg_lsn[], relids oid[], ops text[], rows text[], olds text[], keys jsonb[], committed_at timestamptz[]) returns boolean[]
--
-- WAL capture's side of ferry.skip_wal_change (migration 0037): the relay
-- calls it, in the transaction of the append that would hold them, with the
-- changes it decoded at a position listed in ferry.wal_slot.skip_lsns. Per
-- change (lsns its own WAL position, relids its table, ops I, U, D or T,
-- rows and olds its row and old row as the relay wrote them, keys its
-- column => text values, committed_at its transaction's commit time):
-- whether to leave it out of the append. Only a change the log cannot hold
-- is left out (jsonb refuses its row or old row: a json value such as
-- {"a": 1e1000000}, or one holding \u0000); any other is appended as
-- usual, so a skip asked at the wrong position loses nothing. Each change
-- left out is a gap (ferry.gaps, cause 'wal change skipped', events 1,
-- from_lsn = to_lsn = its position, oldest/newest_event_at its commit
-- time) of each consumer whose streams the capture that held it (at that
-- position) writes to, as ferry._record_wal_loss selects them; the reason
-- names the table, the operation, the position and the row to backfill.
-- Its position leaves ferry.wal_slot.skip_lsns. A change of no capture, or
-- of an operation its capture leaves out, would have been no event: left
-- out with no gap. All of it commits or rolls back with the append (a
-- relay that dies before the commit skips it again, and records it once).
--
-- Calls:   -
-- Reads:   ferry.captures, ferry.consumers, ferry.ticks, ferry.wal_slot
-- Writes:  ferry.gaps, ferry.wal_slot
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay; capture/wal.py)

create or replace function ferry._record_wal_skip(
    lsns pg_lsn[], relids oid[], ops text[], rows text[], olds text[], keys jsonb[], committed_at timestamptz[])
returns boolean[] language plpgsql as $$
declare
    v_out boolean[] := '{}';
    v_done pg_lsn[] := '{}';
    v_error text;
    v_table text;
    v_op text;
    v_where text;
    v_reason text;
    v_newest bigint;
    v_from_tick bigint;
    k ferry.captures;
begin
    perform 1 from ferry.wal_slot w for update;
    select max(t.id) into v_newest from ferry.ticks t;
    for i in 1 .. coalesce(cardinality(lsns), 0) loop
        v_error := null;
        begin
            perform rows[i]::jsonb, olds[i]::jsonb;
        exception when data_exception then
            get stacked diagnostics v_error = message_text;
        end;
        v_out := v_out || (v_error is not null);
        if v_error is null then
            continue;
        end if;
        v_done := v_done || lsns[i];
        select * into k from ferry.captures c
        where c.method = 'wal' and c.relid = relids[i]
          and (c.captured_lsn is null or c.captured_lsn <= lsns[i])
          and (c.uncaptured_lsn is null or c.uncaptured_lsn > lsns[i])
        order by c.id desc limit 1;
        if not found or (ops[i] <> 'T' and not ops[i] = any (array(
                select case o when 'insert' then 'I' when 'update' then 'U' else 'D' end
                from unnest(k.operations) o))) then
            continue;
        end if;
        v_table := relids[i]::regclass::text;
        v_op := case ops[i] when 'I' then 'INSERT' when 'U' then 'UPDATE' when 'D' then 'DELETE' else 'TRUNCATE' end;
        v_where := (select string_agg(case when keys[i] ->> c.col is null then format('%I is null', c.col)
                                           else format('%I = %L', c.col, keys[i] ->> c.col) end,
                                      ' and ' order by c.n)
                    from unnest(k.key_columns) with ordinality c(col, n));
        v_reason := format('the %s of %s at %s (committed %s) held a value the log cannot hold (%s) and was skipped '
                           'with ferry.skip_wal_change: it is not in the log', v_op, v_table, lsns[i],
                           to_char(committed_at[i], 'YYYY-MM-DD HH24:MI:SSOF'), v_error)
                    || case when k.condition is not null then ' (had it matched the capture''s condition)' else '' end
                    || case when ops[i] = 'D' then format('. The row (%s) is deleted: nothing to backfill; readers '
                                                          'holding it must drop it themselves', v_where)
                            when ops[i] = 'T' then format('. Send the table''s current rows: pgferry backfill %s', v_table)
                            else format('. Send that row''s current state: pgferry backfill %s --where "%s"',
                                        v_table, v_where) end;
        select max(t.id) into v_from_tick from ferry.ticks t where t.created_at <= committed_at[i];
        v_from_tick := least(coalesce(v_from_tick, (select min(t.id) from ferry.ticks t)), v_newest);
        insert into ferry.gaps (consumer, subscription, from_tick, to_tick, events, from_lsn, to_lsn, oldest_event_at,
                                newest_event_at, cause, reason)
        select c.name, c.subscription, v_from_tick, v_newest, 1, lsns[i], lsns[i], committed_at[i], committed_at[i],
               'wal change skipped', v_reason
        from ferry.consumers c
        where c.drain_to is null and (c.streams is null or k.stream = any (c.streams));
    end loop;
    if cardinality(v_done) > 0 then
        update ferry.wal_slot w
        set skip_lsns = nullif(array(select s from unnest(w.skip_lsns) s where s <> all (v_done) order by s), '{}');
    end if;
    return v_out;
end $$;
