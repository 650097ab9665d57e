-- ferry._check_headers_map(headers jsonb) returns void
--
-- Refuses subscription or request headers that are not a JSON object of
-- string values with valid HTTP header names and no line break or NUL.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_headers_map(headers jsonb) returns void
language plpgsql immutable as $$
declare
    v_name text;
    v_value jsonb;
begin
    if headers is null then
        return;
    end if;
    if jsonb_typeof(headers) <> 'object' then
        raise exception 'pgferry: headers must be a JSON object of strings, got a JSON %', jsonb_typeof(headers)
            using errcode = '22023', hint = 'Example: ''{"Authorization": "Bearer abc"}''::jsonb';
    end if;
    for v_name, v_value in select * from jsonb_each(headers) loop
        if v_name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' then
            raise exception 'pgferry: % is not a valid HTTP header name', quote_literal(v_name) using errcode = '22023';
        end if;
        if jsonb_typeof(v_value) <> 'string' then
            raise exception 'pgferry: header % must be a string, got a JSON %', quote_literal(v_name), jsonb_typeof(v_value)
                using errcode = '22023';
        end if;
        if v_value #>> '{}' ~ '[\r\n\x00]' then
            raise exception 'pgferry: header % contains a line break or NUL', quote_literal(v_name) using errcode = '22023';
        end if;
    end loop;
end $$;
