-- ferry.publish(stream text, payload jsonb, key text default null, headers jsonb default null) returns bigint
--
-- Appends one event to the log, in the caller's transaction: it becomes
-- visible to readers when that transaction commits, and never if it rolls back.
-- stream: a name of 1-200 characters; payload: any JSON value (not SQL NULL);
-- key: optional, orders and partitions events per key; headers: optional JSON
-- object of strings, sent as HTTP headers with batch_size 1. Returns the event
-- id. A stream ended with ferry.close_stream refuses it (55000), and the
-- header pgferry-control is reserved for that end marker. The writer's hot
-- path: checks are inline, the row goes straight into the current partition.
--
-- Calls:   ferry._check_headers, ferry._check_stream, ferry._current_partition
-- Reads:   ferry.closed_streams
-- Writes:  ferry.events_0, ferry.events_1, ferry.events_2
-- Raises:  22004, 22023, 55000
-- Runs as: its owner (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp)
-- Callers: ferry_relay, ferry_writer (not PUBLIC)

create or replace function ferry.publish(stream text, payload jsonb, key text default null, headers jsonb default null)
returns bigint language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    v_txid xid8;
    v_part smallint;
    v_id   bigint;
begin
    -- Checks inline (not via helper calls): publish is on the writer's hot path.
    if stream is null or length(stream) > 200 or btrim(stream) = '' or stream ~ '[\x01-\x1f\x7f-\x9f]' then
        perform ferry._check_stream(stream);  -- raises the precise error
    end if;
    if payload is null then
        raise exception 'pgferry: payload must not be NULL (use ''null''::jsonb for a JSON null)' using errcode = '22004';
    end if;
    if headers is not null and jsonb_typeof(headers) <> 'object' then
        perform ferry._check_headers(headers);  -- raises the precise error
    end if;
    if exists (select 1 from ferry.closed_streams c where c.stream = publish.stream) then
        raise exception 'pgferry: stream % is closed', quote_literal(stream) using errcode = '55000',
            hint = 'It was ended with ferry.close_stream; publish to a new stream name.';
    end if;
    if jsonb_typeof(headers) = 'object'  -- any case: header names are (PgFerry-Control passed; outside probe)
       and exists (select 1 from jsonb_object_keys(headers) k where lower(k) = 'pgferry-control') then
        raise exception 'pgferry: the header pgferry-control is reserved (it marks the end of a stream)'
            using errcode = '22023';
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

revoke execute on function ferry.publish(text, jsonb, text, jsonb) from public;

grant execute on function ferry.publish(text, jsonb, text, jsonb) to ferry_writer, ferry_relay;
