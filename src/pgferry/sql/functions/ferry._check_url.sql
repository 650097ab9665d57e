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
-- A refusal never shows the URL's query string or fragment (as "?…": it may
-- hold a token or password), nor a query parameter's value but maxlen's and
-- dedup_window's; a broker URL's refusals are delivery/destinations.py's,
-- word for word (`pgferry subscription add` and `apply` show those). TLS
-- schemes of brokers (rediss://, tls://, nats+tls://) are refused as not
-- supported yet, and a Redis database number above 2147483646 as none a
-- server can have.
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
    v_shown   text;
    v_name    text;
begin
    if url is null or btrim(url) = '' then
        raise exception 'pgferry: url must not be empty' using errcode = '22023';
    end if;
    -- As refusals show the URL: its query and fragment may hold a secret (delivery/destinations.py's
    -- shown_in_error); "?stream=x&password=..." was echoed whole (outside probe).
    v_shown := case when url ~ '[?#]' then substring(url from '^[^?#]*') || '?…' else url end;
    v_scheme := lower(substring(url from '^([A-Za-z][A-Za-z0-9+.-]*):'));
    if v_scheme is null then
        raise exception 'pgferry: % is not an absolute URL', quote_literal(v_shown)
            using errcode = '22023', hint = 'Use http://host[:port]/path or https://host[:port]/path.';
    end if;
    if v_scheme in ('rediss', 'tls', 'nats+tls') then
        raise exception 'pgferry: TLS to NATS and Redis is not supported yet (%://)', v_scheme
            using errcode = '22023',
                  hint = 'Use nats:// or redis:// over a network you trust (docs/sinks.md, "TLS").';
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
    if v_scheme in ('nats', 'redis') and url ~ '^[A-Za-z]+://($|[/?#])' then
        -- nats:///orders was "names no subject", redis:///0?stream=x "names no Redis stream"
        raise exception 'pgferry: % names no host; use %', quote_literal(v_shown),
            case v_scheme when 'nats' then 'nats://host:4222/<subject>' else 'redis://host:6379/<db>?stream=<name>' end
            using errcode = '22023';
    end if;
    if v_scheme = 'nats' and url ~ '[?#]' then  -- it said "names no subject" though the subject was there
        raise exception 'pgferry: %: a NATS URL takes no query string or fragment (not repeated here); use nats://host:4222/<subject>',
            quote_literal(v_shown) using errcode = '22023';
    end if;
    if v_scheme = 'nats' and url !~ '^[A-Za-z]+://[^/]+/[^/?#]+$' then
        raise exception 'pgferry: % names no subject to publish to; use nats://host:4222/<subject>, e.g. orders.{key}',
            quote_literal(url)
            using errcode = '22023', hint = 'e.g. nats://127.0.0.1:4222/orders.{key}';
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
    -- Taken, and then every attempt failed as config (outside probe): Redis's databases setting is an int.
    if v_scheme = 'redis' and v_path ~ '^[0-9]+$'  -- compared as 10 digits: no cast of 20 digits to fail
       and (length(ltrim(v_path, '0')) > 10 or lpad(ltrim(v_path, '0'), 10, '0') > '2147483646') then
        raise exception 'pgferry: % is not a Redis database number: a server has at most 2147483647 (its databases setting, 16 by default)',
            quote_literal(v_path) using errcode = '22023';
    end if;
    if v_scheme = 'redis' then
        -- As delivery/destinations.py's parse_redis reads them, in its order: names as written, these
        -- three, once each, the two numbers whole from 1 to 2^31 - 1 (subscribe took maxlen=abc, a
        -- typo'd name and a second stream=, and every event then failed on the relay: outside probe).
        -- An unknown parameter is named only when it looks like a name, never with its value.
        for v_param in
            select split_part(p, '=', 1) as name, strpos(p, '=') > 0 as has_value
            from regexp_split_to_table(substring(url from '[?]([^#]*)'), '&') with ordinality as q(p, n)
            where p <> '' order by n
        loop
            if v_param.name not in ('stream', 'maxlen', 'dedup_window') then
                if v_param.has_value and v_param.name ~ '^[A-Za-z0-9_.-]{1,40}$' then
                    raise exception 'pgferry: unknown Redis parameter %; use stream=, maxlen= and dedup_window=',
                        quote_literal(v_param.name) using errcode = '22023';
                end if;
                raise exception 'pgferry: a Redis URL parameter other than stream=, maxlen= and dedup_window= (not repeated here)'
                    using errcode = '22023';
            end if;
        end loop;
        select name into v_name
        from (select split_part(p, '=', 1) as name, n, count(*) over (partition by split_part(p, '=', 1)) as times
              from regexp_split_to_table(substring(url from '[?]([^#]*)'), '&') with ordinality as q(p, n)
              where p <> '') r
        where times > 1 order by n limit 1;
        if v_name is not null then
            raise exception 'pgferry: % is given more than once', quote_literal(v_name) using errcode = '22023';
        end if;
        if url !~ '^[A-Za-z]+://[^/?#]+(/[0-9]*)?[?](.*&)?stream=[^&#]' then
            raise exception 'pgferry: % names no Redis stream; add ?stream=<name>, e.g. ?stream=orders:{key}',
                quote_literal(v_shown) using errcode = '22023';
        end if;
        -- The stream template as the relay reads it: a %7B in it is a brace there.
        v_stream := substring(url from '[?&]stream=([^&#]*)');
        perform ferry._check_template(v_stream);
        for v_param in
            select split_part(p, '=', 1) as name, substr(p, strpos(p, '=') + 1) as value
            from regexp_split_to_table(substring(url from '[?]([^#]*)'), '&') p
            where split_part(p, '=', 1) in ('maxlen', 'dedup_window')
            order by split_part(p, '=', 1) <> 'maxlen'
        loop
            if v_param.value !~ '^[0-9]{1,10}$' or v_param.value::bigint not between 1 and 2147483647 then
                raise exception 'pgferry: %=%: expected a whole number from 1 to 2147483647', v_param.name,
                    quote_literal(v_param.value) using errcode = '22023';
            end if;
        end loop;
    end if;
    if v_scheme in ('http', 'https') and url ~ '[^\x01-\x7F]' then
        raise exception 'pgferry: % has characters outside ASCII; percent-encode them', quote_literal(v_shown)
            using errcode = '22023', hint = 'e.g. /caf%C3%A9 for /café (UTF-8, as browsers and curl send it).';
    end if;
    if url !~ '^[A-Za-z]+://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?([/?#][^[:space:][:cntrl:]]*)?$' then
        raise exception 'pgferry: malformed URL %', quote_literal(v_shown)
            using errcode = '22023',
                  hint = 'Expected scheme://host[:port]/path with no spaces or control characters.';
    end if;
    if coalesce(substring(url from '^[A-Za-z]+://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+):([0-9]{1,5})')::integer, 1)
       not between 1 and 65535 then
        raise exception 'pgferry: % has a port out of range (1-65535)', quote_literal(v_shown) using errcode = '22023';
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
