-- ferry.set_subscription_credentials(name text, credentials jsonb) returns void
--
-- The credentials a broker sink connects with (migration 0019): for NATS
-- {"user": ..., "password": ...}, {"token": ...} or {"creds_file": "/path"};
-- for Redis {"password": ...} or {"user": ..., "password": ...}. '{}' or
-- null removes them. Kept apart from the URL so that nothing that shows a
-- subscription shows them. Refused: credentials for a webhook (it
-- authenticates with a header or its signing secret; apply took
-- credentials_env there and nothing used them: outside probe), more than
-- one way to log in to NATS (user and password, token, creds_file), a user
-- without a password (the relay logged in as nobody, to Redis as "default",
-- without a word: outside probe), and token or creds_file for Redis.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.subscriptions
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.set_subscription_credentials(name text, credentials jsonb) returns void
language plpgsql as $$
declare
    v_key    text;
    v_scheme text;
    v_ways   integer;
begin
    if credentials is not null and jsonb_typeof(credentials) <> 'object' then
        raise exception 'pgferry: credentials must be a JSON object, got a JSON %', jsonb_typeof(credentials)
            using errcode = '22023';
    end if;
    for v_key in select k from jsonb_object_keys(coalesce(credentials, '{}')) k loop
        if v_key not in ('user', 'password', 'token', 'creds_file') then
            raise exception 'pgferry: unknown credential %', quote_literal(v_key)
                using errcode = '22023', hint = 'Use user and password, token, or creds_file.';
        end if;
        if jsonb_typeof(credentials -> v_key) <> 'string' then
            raise exception 'pgferry: credential % must be a string', quote_literal(v_key) using errcode = '22023';
        end if;
    end loop;
    select lower(substring(s.url from '^([A-Za-z][A-Za-z0-9+.-]*):')) into v_scheme
    from ferry.subscriptions s where s.name = set_subscription_credentials.name;
    if found and coalesce(credentials, '{}') <> '{}' then
        if v_scheme not in ('nats', 'redis') then
            raise exception 'pgferry: subscription % is a webhook: credentials are for NATS and Redis subscriptions',
                quote_literal(name) using errcode = '22023',
                hint = 'A webhook authenticates with a header (headers => ''{"Authorization": "..."}'') or its signing secret.';
        end if;
        v_ways := (credentials ? 'password' or credentials ? 'user')::integer + (credentials ? 'token')::integer
                  + (credentials ? 'creds_file')::integer;
        if v_ways > 1 then
            raise exception 'pgferry: give one way to log in: user and password, token, or creds_file'
                using errcode = '22023';
        end if;
        if credentials ? 'user' and not credentials ? 'password' then
            -- the relay logged in as no one (Redis: as "default") and said nothing (outside probe)
            raise exception 'pgferry: user % needs a password (a Redis ACL user with nopass takes any)',
                quote_literal(credentials->>'user') using errcode = '22023';
        end if;
        if v_scheme = 'redis' and (credentials ? 'token' or credentials ? 'creds_file') then
            raise exception 'pgferry: Redis takes a password, or a user and a password (token and creds_file are NATS''s)'
                using errcode = '22023';
        end if;
    end if;
    update ferry.subscriptions s set credentials = coalesce(set_subscription_credentials.credentials, '{}'),
                                     updated_at = now()
    where s.name = set_subscription_credentials.name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(name) using errcode = '42704';
    end if;
end $$;
