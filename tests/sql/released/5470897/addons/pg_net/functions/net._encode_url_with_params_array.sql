-- net._encode_url_with_params_array(url text, params_array text[]) returns text
--
-- pg_net's URL check and query building: a URL libcurl would refuse fails
-- here, at the call, with libcurl's words (curl_url_strerror), in pg_net's
-- format `invalid URL "<url>": <reason>`; then each param (already
-- percent-encoded, `key=value`) is appended. Only http and https are
-- accepted (pg_net's worker allows no other protocol). Returns the URL to
-- request, with an empty path written "/" as libcurl normalises it.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net._encode_url_with_params_array(url text, params_array text[]) returns text
language plpgsql immutable as $$
declare
    v_url text := url;
    v_reason text;
    v_authority text;
    v_host text;
    v_port text;
begin
    if url is null or params_array is null then
        return null;
    end if;
    v_authority := substring(url from '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)');
    v_authority := regexp_replace(coalesce(v_authority, ''), '^.*@', '');  -- user:password@ is not the host
    if v_authority ~ '^\[' then
        v_host := substring(v_authority from '^(\[[^]]*\]?)');
        v_port := substring(v_authority from '^\[[^]]*\](?::(.*))?$');
    else
        v_host := split_part(v_authority, ':', 1);
        v_port := nullif(substring(v_authority from ':(.*)$'), '');
    end if;
    if url ~ '[[:cntrl:] ]' then
        v_reason := 'Malformed input to a URL function';
    elsif url !~ '^[A-Za-z][A-Za-z0-9+.-]*:' then
        v_reason := 'Bad scheme';  -- no scheme at all (libcurl >= 7.81; pg_net sets no default scheme)
    elsif url !~* '^https?:' then
        v_reason := 'Unsupported URL scheme';  -- e.g. 'localhost:6666' reads as scheme "localhost"
    elsif url !~* '^https?://' then
        v_reason := 'Unsupported number of slashes following scheme';
    elsif v_host = '' then
        v_reason := 'No host part in the URL';
    elsif v_host ~ '^\[' and v_host !~* '^\[[0-9a-f:.]+\]$' then
        v_reason := 'Bad IPv6 address';
    elsif v_host !~ '^\[' and v_host !~ '^[A-Za-z0-9._~%!$&''()*+,;=-]+$' then
        v_reason := 'Bad hostname';
    elsif v_port is not null and (v_port !~ '^[0-9]{1,5}$' or v_port::integer > 65535) then
        v_reason := 'Port number was not a decimal number between 0 and 65535';
    end if;
    if v_reason is not null then
        raise exception 'invalid URL "%": %', url, v_reason using errcode = '22023';
    end if;
    -- An empty path is written as "/", like libcurl's normalised form.
    if v_url ~* '^https?://[^/?#]+$' then
        v_url := v_url || '/';
    elsif v_url ~* '^https?://[^/?#]+[?#]' then
        v_url := regexp_replace(v_url, '^(https?://[^/?#]+)', '\1/', 'i');
    end if;
    if cardinality(params_array) > 0 then
        v_url := v_url || case when position('?' in v_url) > 0 then '&' else '?' end
                 || array_to_string(params_array, '&');
    end if;
    return v_url;
end $$;
