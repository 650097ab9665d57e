-- ferry.token_revoke(name text) returns void
--
-- Revokes the live API token called name: the relays refuse it within their
-- refresh interval (a few seconds). The row stays, with revoked_at set, as
-- the record of who had access; the name is free again for a new token.
--
-- Calls:   -
-- Reads:   ferry.api_tokens
-- Writes:  ferry.api_tokens
-- Raises:  42704 (no live token has that name), 42501 (ferry_relay and
--          ferry_writer: only the installer, or a role it granted UPDATE on
--          ferry.api_tokens, revokes tokens)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.token_revoke(name text) returns void
language plpgsql as $$
begin
    update ferry.api_tokens t set revoked_at = now()
    where t.name = token_revoke.name and t.revoked_at is null;
    if not found then
        raise exception 'pgferry: no token named % (or it is revoked already)', coalesce(quote_literal(name), 'NULL')
            using errcode = '42704', hint = 'See `pgferry token list`.';
    end if;
end $$;
