-- ferry.set_subscription_secrets(name text, secrets text[]) returns void
--
-- Rotation: sign with several secrets at once, then drop the old one.
--
-- Calls:   ferry._check_secret
-- Reads:   -
-- Writes:  ferry.subscriptions
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.set_subscription_secrets(name text, secrets text[]) returns void
language plpgsql as $$
declare
    v_secret text;
begin
    foreach v_secret in array coalesce(secrets, '{}') loop
        perform ferry._check_secret(v_secret);
    end loop;
    update ferry.subscriptions s set secrets = coalesce(set_subscription_secrets.secrets, '{}'), updated_at = now()
    where s.name = set_subscription_secrets.name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(name) using errcode = '42704';
    end if;
end $$;
