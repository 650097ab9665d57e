-- ferry._check_stream(p_stream text) returns void
--
-- Refuses a stream name that is NULL, empty, longer than 200 characters or
-- holds control characters, with the precise reason (publish checks inline
-- and calls this only to raise).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_stream(p_stream text) returns void
language plpgsql immutable as $$
begin
    if p_stream is null or btrim(p_stream) = '' then
        raise exception 'pgferry: stream must be a non-empty name, got %', coalesce(quote_literal(p_stream), 'NULL')
            using errcode = '22023', hint = 'Pass the stream the event belongs to, e.g. ferry.publish(''orders'', ''{"id": 1}'').';
    end if;
    if length(p_stream) > 200 then
        raise exception 'pgferry: stream name is % characters long; the limit is 200', length(p_stream)
            using errcode = '22023';
    end if;
end $$;
