-- ferry.set_subscription_credentials(name text, credentials jsonb) returns void
--
-- The credentials a broker sink connects with (migration 0019): for NATS
-- {"user": ..., "password": ...}, {"token": ...} or {"creds_file": "/path"};
-- for Redis {"password": ...} or {"user": ..., "password": ...}. '{}' or
-- null removes them. Kept apart from the URL so that nothing that shows a
-- subscription shows them.
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
    v_key text;
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
    update ferry.subscriptions s set credentials = coalesce(set_subscription_credentials.credentials, '{}'),
                                     updated_at = now()
    where s.name = set_subscription_credentials.name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(name) using errcode = '42704';
    end if;
end $$;
