-- pgferry 0004: roles and privileges; subscribe validates everything itself.
--
-- Two NOLOGIN group roles, granted to login roles by an administrator:
--
--   ferry_writer  may append events and nothing else: ferry.publish and
--                 ferry.publish_many, the capture triggers on tables it writes,
--                 and (with the pg_net add-on) the net.http_* API. It cannot
--                 read the log, subscriptions (and their signing secrets),
--                 attempts, retries, dead letters or consumers.
--   ferry_relay   what `pgferry run` needs: read and write every ferry table,
--                 truncate rotated partitions, move sequences, call every
--                 function. Also enough for the operator commands (status,
--                 subscription, dlq).
--
-- Roles are cluster-wide, so they are created only when missing: installing
-- into a second database of the same cluster reuses them.
--
-- How writers append without table privileges:
--
-- * publish and publish_many are SECURITY DEFINER (they run as the installer)
--   with search_path pinned to pg_catalog, pg_temp: a caller cannot shadow a
--   function or operator they use, their arguments are plain values (jsonb,
--   text), and they keep the invariants the log depends on (the txid is taken
--   before the partition pointer is read, ids come from the sequence). So a
--   writer needs no privilege on ferry.events at all to publish.
-- * Capture trigger functions stay SECURITY INVOKER on purpose. They turn the
--   writer's rows into JSON (to_jsonb, key columns cast to text), and those
--   conversions call casts that the owner of a column's type may define. Run
--   as the installer, a cast function written by a table owner would run with
--   the installer's rights; run as the writer, it has the writer's. Instead
--   the writer gets INSERT on exactly the columns the triggers fill. The txid,
--   id and created_at columns are not granted, so their defaults always apply
--   and the commit-order machinery cannot be fooled; a writer inserting by
--   hand can only add events to the log, as publish lets it do anyway.

do $$
declare
    v_role text;
begin
    foreach v_role in array array['ferry_writer', 'ferry_relay'] loop
        if not exists (select 1 from pg_roles where rolname = v_role) then
            begin
                execute format('create role %I nologin', v_role);
            exception
                when duplicate_object or unique_violation then
                    null;  -- created at the same moment by an install into another database
                when insufficient_privilege then
                    raise exception 'pgferry: cannot create role %: the installing role needs CREATEROLE', v_role
                        using errcode = '42501',
                              hint = 'Have an administrator run: create role ferry_writer nologin; '
                                     'create role ferry_relay nologin; then run pgferry install again.';
            end;
        end if;
    end loop;
end $$;

---------------------------------------------------------------------------
-- Writers
---------------------------------------------------------------------------

alter function ferry.publish(text, jsonb, text, jsonb)
    security definer set search_path = pg_catalog, pg_temp;
alter function ferry.publish_many(text[], jsonb[], text[], jsonb[])
    security definer set search_path = pg_catalog, pg_temp;
revoke execute on function ferry.publish(text, jsonb, text, jsonb) from public;
revoke execute on function ferry.publish_many(text[], jsonb[], text[], jsonb[]) from public;

grant usage on schema ferry to ferry_writer;
grant execute on function ferry.publish(text, jsonb, text, jsonb) to ferry_writer, ferry_relay;
grant execute on function ferry.publish_many(text[], jsonb[], text[], jsonb[]) to ferry_writer, ferry_relay;
-- The Python API checks the schema version before publishing.
grant select on ferry.schema_migrations to ferry_writer;
-- Capture triggers (SECURITY INVOKER, see above): the columns they fill, the
-- event id sequence behind the id default, and the partition pointer.
grant insert (part, stream, capture, key, payload, op, old_payload)
    on ferry.events_0, ferry.events_1, ferry.events_2 to ferry_writer;
grant usage on sequence ferry.event_id_seq to ferry_writer;
grant select on sequence ferry.current_partition_seq to ferry_writer;

---------------------------------------------------------------------------
-- The relay (and operators)
---------------------------------------------------------------------------

grant usage on schema ferry to ferry_relay;
grant select, insert, update, delete, truncate on all tables in schema ferry to ferry_relay;
grant usage, select, update on all sequences in schema ferry to ferry_relay;
grant execute on all functions in schema ferry to ferry_relay;
-- Tables and sequences that later migrations (run by the same installer) add.
alter default privileges in schema ferry grant select, insert, update, delete, truncate on tables to ferry_relay;
alter default privileges in schema ferry grant usage, select, update on sequences to ferry_relay;

---------------------------------------------------------------------------
-- Subscriptions: every setting checked by subscribe itself
---------------------------------------------------------------------------

-- A setting that only a table CHECK constraint caught (retry_base_ms < 0,
-- max_attempts > 1000) made PostgreSQL report the whole failing row, signing
-- secret included, in the error's DETAIL (and in the server log). subscribe
-- now refuses every bad value before the row exists. Stream names with control
-- characters are refused too: a stream name travels in the pgferry-stream
-- header, and a line break there would inject headers.
create or replace function ferry.subscribe(
    name text,
    streams text[],
    url text,
    batch_size integer default 1,
    max_in_flight integer default 32,
    ordered boolean default false,
    secret text default null,
    headers jsonb default '{}',
    timeout_ms integer default 10000,
    max_attempts integer default 12,
    max_age interval default '3 days',
    retry_base_ms integer default 1000,
    retry_max_ms integer default 600000,
    connect_timeout_ms integer default 5000,
    start_at text default 'now')
returns void language plpgsql as $$
begin
    if name is null or name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$' then
        raise exception 'pgferry: subscription name % must be 1-100 letters, digits, _ . : or -', coalesce(quote_literal(name), 'NULL')
            using errcode = '22023';
    end if;
    if streams is null or cardinality(streams) = 0
       or exists (select 1 from unnest(streams) s where s is null or btrim(s) = '') then
        raise exception 'pgferry: streams must list at least one non-empty stream name' using errcode = '22023';
    end if;
    if exists (select 1 from unnest(streams) s where s ~ '[[:cntrl:]]' or length(s) > 200) then
        raise exception 'pgferry: stream names must be at most 200 characters without control characters (line breaks, NUL, ...)'
            using errcode = '22023';
    end if;
    perform ferry._check_url(url);
    perform ferry._check_headers_map(headers);
    if secret is not null then
        perform ferry._check_secret(secret);
    end if;
    if batch_size is null or batch_size not between 1 and 1000 then
        raise exception 'pgferry: batch_size must be between 1 and 1000, got %', batch_size using errcode = '22023';
    end if;
    if max_in_flight is null or max_in_flight not between 1 and 1000 then
        raise exception 'pgferry: max_in_flight must be between 1 and 1000, got %', max_in_flight using errcode = '22023';
    end if;
    if timeout_ms is null or connect_timeout_ms is null
       or timeout_ms not between 10 and 600000 or connect_timeout_ms not between 10 and 600000 then
        raise exception 'pgferry: timeouts must be between 10 ms and 10 minutes' using errcode = '22023';
    end if;
    if max_attempts is null or max_attempts not between 1 and 1000 then
        raise exception 'pgferry: max_attempts must be between 1 and 1000, got %', max_attempts using errcode = '22023';
    end if;
    if max_age is null or max_age <= interval '0' then
        raise exception 'pgferry: max_age must be a positive interval, got %', max_age using errcode = '22023';
    end if;
    if retry_base_ms is null or retry_max_ms is null or retry_base_ms < 0 or retry_max_ms < 0 then
        raise exception 'pgferry: retry_base_ms and retry_max_ms must be 0 or more' using errcode = '22023';
    end if;
    if ordered is null then
        raise exception 'pgferry: ordered must be true or false' using errcode = '22023';
    end if;

    insert into ferry.subscriptions as s (name, streams, url, headers, secrets, batch_size, max_in_flight, ordered,
                                          timeout_ms, connect_timeout_ms, max_attempts, max_age, retry_base_ms, retry_max_ms)
    values (subscribe.name, subscribe.streams, subscribe.url, coalesce(subscribe.headers, '{}'),
            case when subscribe.secret is null then '{}' else array[subscribe.secret] end,
            subscribe.batch_size, subscribe.max_in_flight, subscribe.ordered, subscribe.timeout_ms,
            subscribe.connect_timeout_ms, subscribe.max_attempts, subscribe.max_age,
            subscribe.retry_base_ms, subscribe.retry_max_ms)
    on conflict on constraint subscriptions_pkey do update set
        streams = excluded.streams, url = excluded.url, headers = excluded.headers,
        secrets = case when subscribe.secret is null then s.secrets else excluded.secrets end,
        batch_size = excluded.batch_size, max_in_flight = excluded.max_in_flight, ordered = excluded.ordered,
        timeout_ms = excluded.timeout_ms, connect_timeout_ms = excluded.connect_timeout_ms,
        max_attempts = excluded.max_attempts, max_age = excluded.max_age,
        retry_base_ms = excluded.retry_base_ms, retry_max_ms = excluded.retry_max_ms, updated_at = now();
    perform ferry.register_consumer('webhook:' || subscribe.name, subscribe.streams, start_at);
end $$;

-- IP literals in always-refused ranges are refused at subscribe, as before,
-- unless the session's pgferry.allow_addresses lists them (e.g.
-- `alter database app set pgferry.allow_addresses = '169.254.10.0/24'`). This
-- is only the early error: the relay decides on the address it connects to,
-- with its own PGFERRY_ALLOW_ADDRESSES.
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
    if v_scheme not in ('http', 'https') then
        raise exception 'pgferry: unsupported URL scheme %; webhooks are sent over http or https', quote_literal(v_scheme)
            using errcode = '22023';
    end if;
    if url !~ '^[A-Za-z]+://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?([/?#][^[:space:][:cntrl:]]*)?$' then
        raise exception 'pgferry: malformed URL %', quote_literal(url)
            using errcode = '22023',
                  hint = 'Expected http(s)://host[:port]/path with no spaces, control characters or user:password part.';
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
