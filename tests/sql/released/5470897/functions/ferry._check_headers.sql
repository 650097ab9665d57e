-- ferry._check_headers(p_headers jsonb) returns void
--
-- Refuses event headers that are not a JSON object (publish's own check;
-- values are checked by the sender, off the hot path).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_headers(p_headers jsonb) returns void
language plpgsql immutable as $$
begin
    if p_headers is not null and jsonb_typeof(p_headers) <> 'object' then
        raise exception 'pgferry: headers must be a JSON object of strings, got a JSON %', jsonb_typeof(p_headers)
            using errcode = '22023', hint = 'Example: ''{"x-tenant": "acme"}''::jsonb';
    end if;
end $$;
