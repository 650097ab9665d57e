-- ferry._check_header_values(headers jsonb) returns void
--
-- Refuses header values holding a control character other than HTAB (bytes
-- 0x01-0x08, 0x0A-0x1F and DEL, 0x7F), which RFC 9110 does not allow in a
-- field value: strict servers (llhttp, so Node and aiohttp; h11 for VT and FF)
-- answer such a request 400, and every event of the subscription would end in
-- dead letters. Spaces, tabs and non-ASCII text (sent as UTF-8, obs-text on
-- the wire) are allowed. The message names the header and the byte, never
-- the value (it may be a credential). Expects a JSON object of strings
-- (ferry._check_headers_map checks that first). The pg_net API does not call
-- it: pg_net's libcurl sends such bytes as they are.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_header_values(headers jsonb) returns void
language plpgsql immutable as $$
declare
    v_name text;
    v_value text;
    v_bad text;
begin
    if headers is null or jsonb_typeof(headers) <> 'object' then
        return;
    end if;
    for v_name, v_value in select key, value from jsonb_each_text(headers) loop
        v_bad := substring(v_value from '[\x01-\x08\x0a-\x1f\x7f]');
        if v_bad is not null then
            raise exception 'pgferry: header % contains the control character 0x% (character % of its value), which HTTP does not allow in a header value',
                quote_literal(v_name), upper(lpad(to_hex(ascii(v_bad)), 2, '0')), strpos(v_value, v_bad)
                using errcode = '22023',
                      hint = 'A header value may hold visible characters, spaces, tabs and non-ASCII text; '
                             'encode anything else (e.g. percent-encoding or base64).';
        end if;
    end loop;
end $$;
