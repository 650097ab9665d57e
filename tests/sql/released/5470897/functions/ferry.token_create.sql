-- ferry.token_create(name text, token_hash bytea, read_patterns text[] default '{}', write_patterns text[] default '{}') returns bigint
--
-- Stores a new API token for the streams HTTP API: its name (a label, unique
-- among the tokens not revoked), the SHA-256 of the token (never the token:
-- `pgferry token create` makes the token, passes its hash here and shows the
-- token once), and the stream patterns it may read and write. Returns the
-- token's id.
--
-- Calls:   ferry._check_token_patterns
-- Reads:   ferry.api_tokens
-- Writes:  ferry.api_tokens
-- Raises:  22023 (bad name, hash or pattern: the message says which),
--          23505 (a live token has that name, or the hash is stored
--          already), 42501 (ferry_relay and
--          ferry_writer: only the installer, or a role it granted INSERT on
--          ferry.api_tokens, creates tokens)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.token_create(
    name text,
    token_hash bytea,
    read_patterns text[] default '{}',
    write_patterns text[] default '{}')
returns bigint language plpgsql as $$
declare
    v_id bigint;
    v_constraint text;
begin
    if name is null or name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$' then
        raise exception 'pgferry: token name % must be 1-100 letters, digits, _ . : or -', coalesce(quote_literal(name), 'NULL')
            using errcode = '22023';
    end if;
    if token_hash is null or octet_length(token_hash) <> 32 then
        raise exception 'pgferry: token_hash must be the 32-byte SHA-256 of the token'
            using errcode = '22023';
    end if;
    perform ferry._check_token_patterns(read_patterns, 'read');
    perform ferry._check_token_patterns(write_patterns, 'write');
    if coalesce(cardinality(read_patterns), 0) + coalesce(cardinality(write_patterns), 0) = 0 then
        raise exception 'pgferry: token % would allow nothing: give it at least one read or write pattern', quote_literal(name)
            using errcode = '22023', hint = 'For example --read ''orders.*'' or --write ''*''.';
    end if;
    begin
        insert into ferry.api_tokens (name, token_hash, read_patterns, write_patterns)
        values (token_create.name, token_create.token_hash,
                coalesce(token_create.read_patterns, '{}'), coalesce(token_create.write_patterns, '{}'))
        returning id into v_id;
    exception when unique_violation then
        get stacked diagnostics v_constraint = constraint_name;
        if v_constraint = 'api_tokens_live_name_idx' then
            raise exception 'pgferry: a token named % already exists', quote_literal(name)
                using errcode = '23505', hint = 'Revoke it first (pgferry token revoke), or choose another name.';
        end if;
        raise exception 'pgferry: a token with this hash is stored already; make a new token'
            using errcode = '23505';
    end;
    return v_id;
end $$;
