-- ferry._check_url(url text) returns void
--
-- The scheme chooses the sink: http(s) webhooks, nats:// (JetStream: a
-- subject template as path) or redis:// (Redis Streams: a stream template
-- as ?stream=); templates may use {stream} and {key} (delivery/destinations.py
-- parses them fully on the relay). IP literals in always-refused ranges are refused at subscribe, as before,
-- unless the session's pgferry.allow_addresses lists them (e.g.
-- `alter database app set pgferry.allow_addresses = '169.254.10.0/24'`). This
-- is only the early error: the relay decides on the address it connects to,
-- with its own PGFERRY_ALLOW_ADDRESSES.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_url(url text) returns void
language plpgsql stable as $$
declare
    v_scheme text;
    v_ip inet;
begin
    if url is null or btrim(url) = '' then
        raise exception 'pgferry: url must not be empty' using errcode = '22023';
    end if;
    v_scheme := lower(substring(url from '^([A-Za-z][A-Za-z0-9+.-]*):'));
    if v_scheme is null then
        raise exception 'pgferry: % is not an absolute URL', quote_literal(url)
            using errcode = '22023', hint = 'Use http://host[:port]/path or https://host[:port]/path.';
    end if;
    if v_scheme not in ('http', 'https', 'nats', 'redis') then
        raise exception 'pgferry: unsupported URL scheme %', quote_literal(v_scheme)
            using errcode = '22023',
                  hint = 'Webhooks use http:// or https://, NATS JetStream nats://host:4222/<subject>, '
                         'Redis Streams redis://host:6379/<db>?stream=<name>.';
    end if;
    if v_scheme = 'nats' and url !~ '^[A-Za-z]+://[^/]+/[^/?#]+$' then
        raise exception 'pgferry: % names no subject to publish to', quote_literal(url)
            using errcode = '22023', hint = 'Use nats://host:4222/<subject>, e.g. nats://127.0.0.1:4222/orders.{key}.';
    end if;
    if v_scheme = 'redis' and url !~ '^[A-Za-z]+://[^/?#]+(/[0-9]*)?[?](.*&)?stream=[^&]' then
        raise exception 'pgferry: % names no Redis stream', quote_literal(url)
            using errcode = '22023', hint = 'Use redis://host:6379/<db>?stream=<name>, e.g. ?stream=orders:{key}.';
    end if;
    if v_scheme in ('nats', 'redis') and regexp_replace(url, '\{(stream|key)\}', '', 'g') ~ '[{}]' then
        raise exception 'pgferry: % has an unknown placeholder or a stray brace', quote_literal(url)
            using errcode = '22023', hint = 'A subject or stream name may use {stream} and {key}.';
    end if;
    if url !~ '^[A-Za-z]+://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?([/?#][^[:space:][:cntrl:]]*)?$' then
        raise exception 'pgferry: malformed URL %', quote_literal(url)
            using errcode = '22023',
                  hint = 'Expected http(s)://host[:port]/path with no spaces, control characters or user:password part.';
    end if;
    if coalesce(substring(url from '^[A-Za-z]+://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+):([0-9]{1,5})')::integer, 1)
       not between 1 and 65535 then
        raise exception 'pgferry: % has a port out of range (1-65535)', quote_literal(url) using errcode = '22023';
    end if;
    begin
        v_ip := coalesce(substring(url from '^[A-Za-z]+://\[([0-9A-Fa-f:.]+)\]'),
                         substring(url from '^[A-Za-z]+://([0-9.]+)(?:[:/?#]|$)'))::inet;
    exception when others then
        v_ip := null;
    end;
    if v_ip is not null and (v_ip << '169.254.0.0/16' or v_ip << 'fe80::/10' or v_ip = 'fd00:ec2::254')
       and not exists (select 1 from regexp_split_to_table(coalesce(current_setting('pgferry.allow_addresses', true), ''), '[,\s]+') a
                       where a <> '' and v_ip <<= a::cidr) then
        raise exception 'pgferry: % is a link-local or cloud-metadata address; webhooks may not be sent there', host(v_ip)
            using errcode = '22023',
                  hint = 'This protects the relay''s network from SSRF. To allow it, list it in pgferry.allow_addresses '
                         '(alter database ... set pgferry.allow_addresses = ''cidr,...'') and in the relay''s PGFERRY_ALLOW_ADDRESSES.';
    end if;
end $$;
