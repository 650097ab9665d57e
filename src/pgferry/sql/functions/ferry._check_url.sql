-- ferry._check_url(url text) returns void
--
-- The scheme chooses the sink: http(s) webhooks, nats:// (JetStream: a
-- subject template as path) or redis:// (Redis Streams: a stream template
-- as ?stream=); templates may use {stream} and {key} (delivery/destinations.py
-- parses them fully on the relay; its rules for the subject and for
-- Redis's parameters are checked here too, so that what subscribe takes the
-- relay can send to). Webhook URLs are ASCII: a path or query with other
-- characters must be percent-encoded (the relay cannot send it as it is).
-- IP literals in always-refused ranges are refused at subscribe, as before,
-- unless the session's pgferry.allow_addresses lists them (e.g.
-- `alter database app set pgferry.allow_addresses = '169.254.10.0/24'`). This
-- is only the early error: the relay decides on the address it connects to,
-- with its own PGFERRY_ALLOW_ADDRESSES.
--
-- Calls:   ferry._check_template
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_url(url text) returns void
language plpgsql stable as $$
declare
    v_param   record;
    v_scheme  text;
    v_ip      inet;
    v_subject text;
    v_hex     text;
    v_path    text;
    v_stream  text;
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
    -- Before any message that shows the URL: a password in it would be printed and logged.
    if url ~ '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@' then
        raise exception 'pgferry: the URL holds a user or password (not repeated here); credentials do not go in the URL'
            using errcode = '22023',
                  hint = 'Webhooks: a header (headers => ''{"Authorization": "..."}'') or a signing secret; NATS and '
                         'Redis: ferry.set_subscription_credentials (pgferry subscription credentials).';
    end if;
    if v_scheme = 'nats' and url !~ '^[A-Za-z]+://[^/]+/[^/?#]+$' then
        raise exception 'pgferry: % names no subject to publish to', quote_literal(url)
            using errcode = '22023', hint = 'Use nats://host:4222/<subject>, e.g. nats://127.0.0.1:4222/orders.{key}.';
    end if;
    if v_scheme = 'nats' then
        perform ferry._check_template(substring(url from '^[A-Za-z]+://[^/]+/([^?#]*)'));
        -- The subject as the relay reads it (percent-decoded, the placeholders filled in) must
        -- be one to publish to: this was checked by `pgferry subscription add` only, and
        -- ferry.subscribe and apply took k.*, k.>, k..{key} (outside probe).
        v_subject := replace(replace(substring(url from '^[A-Za-z]+://[^/]+/([^?#]*)'), '{stream}', 's'), '{key}', 'k');
        while v_subject ~ '%[0-9A-Fa-f]{2}' loop
            v_hex := substring(v_subject from '%([0-9A-Fa-f]{2})');
            v_subject := replace(v_subject, '%' || v_hex,
                                 case when v_hex = '00' then ' ' else chr(('x' || v_hex)::bit(8)::integer) end);
        end loop;
        if v_subject ~ '[[:space:][:cntrl:]]'
           or exists (select 1 from unnest(string_to_array(v_subject, '.')) t where t in ('', '*', '>')) then
            raise exception 'pgferry: % is not a subject to publish to (no spaces, empty tokens or wildcards)',
                quote_literal(substring(url from '^[A-Za-z]+://[^/]+/(.*)$'))
                using errcode = '22023', hint = 'Use tokens separated by dots, e.g. nats://127.0.0.1:4222/orders.{key}.';
        end if;
        -- $JS.API..., $SYS..., _INBOX...: the server's own subjects, where an event would be a command
        -- ($JS.API.STREAM.PURGE.{key} purged a stream, outside probe) or a reply to someone else.
        if v_subject ~ '^(\$|_INBOX\.)' then
            raise exception 'pgferry: % is a subject of the NATS server itself, not one to publish events to',
                quote_literal(substring(url from '^[A-Za-z]+://[^/]+/(.*)$'))
                using errcode = '22023',
                      hint = 'Subjects starting with $ ($JS.API, $SYS, ...) or _INBOX. are commands and replies; '
                             'publish to a subject a JetStream stream captures, e.g. orders.{key}.';
        end if;
    end if;
    -- A database that is not a number was "names no Redis stream" (outside probe).
    v_path := btrim(substring(url from '^[A-Za-z]+://[^/?#]+/([^?#]*)'), '/');
    if v_scheme = 'redis' and v_path <> '' and v_path !~ '^[0-9]+$' then
        raise exception 'pgferry: % is not a Redis database number; use redis://host:6379/0?stream=<name>',
            quote_literal(v_path) using errcode = '22023';
    end if;
    if v_scheme = 'redis' and url !~ '^[A-Za-z]+://[^/?#]+(/[0-9]*)?[?](.*&)?stream=[^&]' then
        raise exception 'pgferry: % names no Redis stream', quote_literal(url)
            using errcode = '22023', hint = 'Use redis://host:6379/<db>?stream=<name>, e.g. ?stream=orders:{key}.';
    end if;
    if v_scheme = 'redis' then
        -- As delivery/destinations.py's parse_redis reads them: these three, once each, the two
        -- numbers whole from 1 to 2^31 - 1 (subscribe took maxlen=abc, a typo'd name and a second
        -- stream=, and every event then failed on the relay: outside probe).
        for v_param in
            select split_part(p, '=', 1) as name, substr(p, strpos(p, '=') + 1) as value,
                   count(*) over (partition by split_part(p, '=', 1)) as times
            from regexp_split_to_table(substring(url from '[?]([^#]*)'), '&') p
            where p <> ''
        loop
            if v_param.name not in ('stream', 'maxlen', 'dedup_window') then
                raise exception 'pgferry: unknown Redis parameter % in %', quote_literal(v_param.name), quote_literal(url)
                    using errcode = '22023', hint = 'Use stream=, maxlen= and dedup_window=.';
            end if;
            if v_param.times > 1 then
                raise exception 'pgferry: % is given more than once in %', quote_literal(v_param.name), quote_literal(url)
                    using errcode = '22023';
            end if;
            if v_param.name <> 'stream' and (v_param.value !~ '^[0-9]{1,10}$'
                                             or v_param.value::bigint not between 1 and 2147483647) then
                raise exception 'pgferry: %=%: expected a whole number from 1 to 2147483647', v_param.name,
                    quote_literal(v_param.value) using errcode = '22023';
            end if;
        end loop;
        -- The stream template as the relay reads it: a %7B in it is a brace there.
        v_stream := substring(url from '[?&]stream=([^&#]*)');
        perform ferry._check_template(v_stream);
    end if;
    if v_scheme in ('http', 'https') and url ~ '[^\x01-\x7F]' then
        raise exception 'pgferry: % has characters outside ASCII; percent-encode them', quote_literal(url)
            using errcode = '22023', hint = 'e.g. /caf%C3%A9 for /café (UTF-8, as browsers and curl send it).';
    end if;
    if url !~ '^[A-Za-z]+://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?([/?#][^[:space:][:cntrl:]]*)?$' then
        raise exception 'pgferry: malformed URL %', quote_literal(url)
            using errcode = '22023',
                  hint = 'Expected scheme://host[:port]/path with no spaces or control characters.';
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
    if v_ip is not null and (v_ip << '169.254.0.0/16' or v_ip << 'fe80::/10'
                             or v_ip in ('fd00:ec2::254', '100.100.100.200', '168.63.129.16', '192.0.0.192'))
       and not exists (select 1 from regexp_split_to_table(coalesce(current_setting('pgferry.allow_addresses', true), ''), '[,\s]+') a
                       where a <> '' and v_ip <<= a::cidr) then
        raise exception 'pgferry: % is a link-local or cloud-metadata address; webhooks may not be sent there', host(v_ip)
            using errcode = '22023',
                  hint = 'This protects the relay''s network from SSRF. To allow it, list it in pgferry.allow_addresses '
                         '(alter database ... set pgferry.allow_addresses = ''cidr,...'') and in the relay''s PGFERRY_ALLOW_ADDRESSES.';
    end if;
end $$;
