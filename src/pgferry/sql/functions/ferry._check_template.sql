-- ferry._check_template(p_encoded text) returns void
--
-- Refuses a broker subscription's subject or stream template, as written in
-- its URL (percent-encoded), that the relay could not render once decoded,
-- with the words of delivery/destinations.py's Template, so that
-- ferry.subscribe, `pgferry apply` and `pgferry subscription add` refuse the
-- same templates the same way: a placeholder other than {stream} and {key}
-- (the first one), or a brace that is neither one of them nor an escaped
-- {{ or }} (a literal brace, e.g. a Redis Cluster hash tag {{orders}}:{key}).
-- Matching the encoded URL let ?stream=%7Borders%7D:{key} through, and the
-- relay failed every event with "unknown placeholder {orders}" (outside probe).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_template(p_encoded text) returns void
language plpgsql immutable as $$
declare
    v_template text;
    v_token   text;
    v_unknown text;
    v_stray   boolean := false;
begin
    -- Decoded as the relay's urllib does (UTF-8); bytes that are not UTF-8 hold no brace.
    select string_agg(case when t[1] ~ '^%[0-9A-Fa-f]{2}$' then substr(t[1], 2)
                           else encode(convert_to(t[1], 'UTF8'), 'hex') end, '' order by n)
      into v_template
      from regexp_matches(coalesce(p_encoded, ''), '(%[0-9A-Fa-f]{2}|[^%]+|%)', 'g') with ordinality as m(t, n);
    begin
        v_template := convert_from(decode(coalesce(v_template, ''), 'hex'), 'UTF8');
    exception when others then
        v_template := p_encoded;
    end;
    -- Left to right, as the relay's tokenizer reads it; the longest token wins at each place.
    for v_token in select m[1] from regexp_matches(v_template, '(\{\{|\}\}|\{[^{}]*\}|[{}])', 'g') m loop
        if v_token in ('{{', '}}', '{stream}', '{key}') then
            continue;
        elsif length(v_token) > 1 then
            v_unknown := coalesce(v_unknown, v_token);
        else
            v_stray := true;
        end if;
    end loop;
    if v_unknown is not null then
        raise exception 'pgferry: unknown placeholder % in %; use {stream} or {key}', v_unknown, quote_literal(v_template)
            using errcode = '22023', hint = 'A literal brace is written {{ or }}, e.g. ?stream={{orders}}:{key}.';
    end if;
    if v_stray then
        raise exception 'pgferry: unbalanced braces in %; write a literal brace as {{ or }}', quote_literal(v_template)
            using errcode = '22023', hint = 'A subject or stream name may use {stream} and {key}.';
    end if;
end $$;
