-- ferry._check_headers_map(headers jsonb, strict boolean default false) returns void
--
-- Refuses subscription or request headers that are not a JSON object of
-- string values with valid HTTP header names and no line break (CR or LF:
-- it would end the header; PostgreSQL text holds no NUL). What any request
-- must meet, the pg_net API's too (net._enqueue, lenient: pg_net's libcurl
-- sends other control bytes as they are).
-- strict (ferry.subscribe): also refuses a control character other than HTAB
-- in a value (bytes 0x01-0x08, 0x0A-0x1F and DEL, 0x7F), which RFC 9110 does
-- not allow in a field value: strict servers (llhttp, so Node and aiohttp;
-- h11 for VT and FF) answer such a request 400, and every event of the
-- subscription would end in dead letters. Spaces, tabs and non-ASCII text
-- (sent as UTF-8, obs-text on the wire) are allowed. The message names the
-- header and the byte, never the value (it may be a credential). strict also
-- refuses two names differing only in case: one header, of which the relay
-- sent one value and dropped the other (outside probe).
-- strict also refuses the headers pgferry writes itself: the Standard
-- Webhooks trio (webhook-id, webhook-timestamp, webhook-signature: a
-- subscription header of that name replaced the signature, outside probe),
-- pgferry-stream, pgferry-key and pgferry-key-encoding (the event's stream
-- and key), pgferry-stream-encoding and pgferry-encoded-headers (JetStream's
-- marks of percent-encoded values), pgferry-json-headers and
-- pgferry-other-headers (JetStream's carriers of headers that are not strings
-- or have no name NATS takes), JetStream's Nats-Msg-Id (its duplicate
-- check), and what frames
-- the request (host, content-length, transfer-encoding). The same names as
-- delivery/request.py's and delivery/jetstream.py's RESERVED.
-- One loop over the map for both (migration 0026: the strict rule was
-- ferry._check_header_values, a second loop).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_headers_map(headers jsonb, strict boolean default false) returns void
language plpgsql immutable as $$
declare
    v_name text;
    v_value jsonb;
    v_text text;
    v_bad text;
begin
    if headers is null then
        return;
    end if;
    if jsonb_typeof(headers) <> 'object' then
        raise exception 'pgferry: headers must be a JSON object of strings, got a JSON %', jsonb_typeof(headers)
            using errcode = '22023', hint = 'Example: ''{"Authorization": "Bearer abc"}''::jsonb';
    end if;
    if strict then  -- a subscription's headers go out as one set: names differing in case are one header
        select min(k) into v_bad from jsonb_object_keys(headers) k group by lower(k) having count(*) > 1 limit 1;
        if v_bad is not null then
            raise exception 'pgferry: header % is given more than once (header names ignore case)', quote_literal(v_bad)
                using errcode = '22023';
        end if;
    end if;
    for v_name, v_value in select * from jsonb_each(headers) loop
        if v_name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' then
            raise exception 'pgferry: % is not a valid HTTP header name', quote_literal(v_name) using errcode = '22023';
        end if;
        if strict and lower(v_name) in ('webhook-id', 'webhook-timestamp', 'webhook-signature', 'pgferry-stream',
                                        'pgferry-key', 'pgferry-key-encoding', 'pgferry-stream-encoding',
                                        'pgferry-encoded-headers', 'pgferry-json-headers',
                                        'pgferry-other-headers', 'nats-msg-id', 'host', 'content-length',
                                        'transfer-encoding') then
            raise exception 'pgferry: header % is one pgferry sets itself on every delivery', quote_literal(v_name)
                using errcode = '22023',
                      hint = 'webhook-id, webhook-timestamp and webhook-signature are computed per request (give '
                             'a secret to sign), pgferry-stream and pgferry-key carry the event''s stream and key, Nats-Msg-Id is '
                             'JetStream''s duplicate check, and the HTTP client frames the request.';
        end if;
        if jsonb_typeof(v_value) <> 'string' then
            raise exception 'pgferry: header % must be a string, got a JSON %', quote_literal(v_name), jsonb_typeof(v_value)
                using errcode = '22023';
        end if;
        v_text := v_value #>> '{}';
        if v_text ~ '[\r\n]' then
            raise exception 'pgferry: header % contains a line break (0x%), which would end the header',
                quote_literal(v_name), upper(lpad(to_hex(ascii(substring(v_text from '[\r\n]'))), 2, '0'))
                using errcode = '22023';
        end if;
        if strict then
            v_bad := substring(v_text from '[\x01-\x08\x0a-\x1f\x7f]');
            if v_bad is not null then
                raise exception 'pgferry: header % contains the control character 0x% (character % of its value), which HTTP does not allow in a header value',
                    quote_literal(v_name), upper(lpad(to_hex(ascii(v_bad)), 2, '0')), strpos(v_text, v_bad)
                    using errcode = '22023',
                          hint = 'A header value may hold visible characters, spaces, tabs and non-ASCII text; '
                                 'encode anything else (e.g. percent-encoding or base64).';
            end if;
        end if;
    end loop;
end $$;
