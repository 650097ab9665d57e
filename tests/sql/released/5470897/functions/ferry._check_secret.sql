-- ferry._check_secret(secret text) returns void
--
-- Refuses a signing secret that is not whsec_<base64> of at least 16 bytes.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_secret(secret text) returns void
language plpgsql immutable as $$
declare
    v_key bytea;
begin
    if secret is null or secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' then
        raise exception 'pgferry: signing secrets must look like whsec_<base64>'
            using errcode = '22023', hint = 'Generate one with `pgferry subscription secret`.';
    end if;
    begin
        v_key := decode(substr(secret, 7), 'base64');
    exception when others then
        raise exception 'pgferry: signing secret is not valid base64 after whsec_' using errcode = '22023';
    end;
    if length(v_key) < 16 then
        raise exception 'pgferry: signing secret is too short; use at least 16 random bytes' using errcode = '22023';
    end if;
end $$;
