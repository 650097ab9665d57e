-- ferry.close_stream(stream text) returns bigint
--
-- Ends a stream, in the caller's transaction: appends its end marker (an
-- event of the stream with headers {"pgferry-control": "end"} and a null
-- payload), after which stream readers stop (`Ferry.read_stream`, the HTTP
-- API's `end` event), and records the stream in ferry.closed_streams so that
-- later publishes to it fail (55000). Closing a closed stream returns its
-- end marker's id again. A stream a captured table writes cannot be closed
-- (its triggers would go on writing to it), nor 'net.http' (pg_net's
-- requests, every session's).
-- Returns the end marker's event id (its offset is the end of the stream).
--
-- Calls:   ferry._check_stream, ferry._current_partition
-- Reads:   ferry.captures, ferry.closed_streams
-- Writes:  ferry.events_0, ferry.events_1, ferry.events_2, ferry.closed_streams
-- Raises:  22004, 22023, 55000
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: ferry_relay, ferry_writer (not PUBLIC)

create or replace function ferry.close_stream(stream text) returns bigint
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    v_end bigint;
    v_txid xid8;
    v_part smallint;
begin
    if stream is null or length(stream) > 200 or btrim(stream) = '' then
        perform ferry._check_stream(stream);  -- raises the precise error
    end if;
    -- One closer at a time per stream (advisory class 0x7068, the hash of its name), until its
    -- transaction ends: concurrent closes each wrote an end marker and returned its own id, and
    -- readers stopped at only one of them. The second one waits, then finds the first's.
    perform pg_advisory_xact_lock(28776, hashtext(close_stream.stream));
    select c.end_event into v_end from ferry.closed_streams c where c.stream = close_stream.stream;
    if found then
        return v_end;
    end if;
    if close_stream.stream = 'net.http' then  -- a writer closed it, and every net.http_* call failed (outside probe)
        raise exception 'pgferry: stream ''net.http'' carries the net.http_* requests of every session and cannot be closed'
            using errcode = '55000';
    end if;
    if exists (select 1 from ferry.captures c where c.stream = close_stream.stream and c.uncaptured_at is null) then
        raise exception 'pgferry: stream % is written by a captured table and cannot be closed', quote_literal(stream)
            using errcode = '55000', hint = 'Stop the capture first: ferry.uncapture_table(table).';
    end if;
    v_txid := pg_current_xact_id();
    v_part := ferry._current_partition();
    if v_part = 0 then
        insert into ferry.events_0 (part, txid, stream, payload, headers)
        values (0, v_txid, stream, 'null', '{"pgferry-control": "end"}') returning id into v_end;
    elsif v_part = 1 then
        insert into ferry.events_1 (part, txid, stream, payload, headers)
        values (1, v_txid, stream, 'null', '{"pgferry-control": "end"}') returning id into v_end;
    else
        insert into ferry.events_2 (part, txid, stream, payload, headers)
        values (2, v_txid, stream, 'null', '{"pgferry-control": "end"}') returning id into v_end;
    end if;
    insert into ferry.closed_streams (stream, end_event, end_txid) values (close_stream.stream, v_end, v_txid)
    on conflict on constraint closed_streams_pkey do nothing;  -- (cannot happen now: the lock above)
    return v_end;
end $$;

revoke execute on function ferry.close_stream(text) from public;

grant execute on function ferry.close_stream(text) to ferry_writer, ferry_relay;
