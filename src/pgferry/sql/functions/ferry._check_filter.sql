-- ferry._check_filter(filter text) returns void
--
-- Refuses a subscription filter that could never work: text that is not a
-- jsonpath, one longer than 1,000 characters, one that names a variable
-- other than $stream, $key and $headers (the one error jsonb_path_match
-- raises even in silent mode: every read would fail; found in the text,
-- since an evaluation stops before a variable behind a false left side of
-- &&), and one that is not a predicate (a plain path such as
-- '$.record.amount' selects a value; the filter must say what is true of
-- it: '$.record.amount > 100'), found by evaluating the filter, not
-- silently, on two small documents whose variables are null and then
-- strings/objects: a predicate gives one true, false or null there,
-- anything else raises. And a filter with a .**
-- accessor not bounded to at most 1000 levels ('$.**{0 to 50}'): .**
-- descends by recursion, and over a payload nested ~11,000 deep (which any
-- writer may publish) it raised "stack depth limit exceeded" even in silent
-- mode, failing every read of the subscription from that event on.
--
-- Parameters: filter   the jsonpath text; NULL passes (no filter)
-- Returns:    nothing.
-- Calls:      -
-- Reads:      -
-- Writes:     -
-- Raises:     22023 naming the problem, with a hint showing a valid filter
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._check_filter(filter text) returns void
language plpgsql stable as $$
declare
    v_path jsonpath;
    v_unknown text;
    v_hint constant text := 'A filter is a jsonpath predicate over the payload ($) and $stream, $key, $headers, '
                            'e.g. ''$.record.amount > 100'' or ''$headers.tenant == "acme" && $.type == "INSERT"''.';
begin
    if filter is null then
        return;
    end if;
    if length(filter) > 1000 then
        raise exception 'pgferry: filter must be at most 1000 characters, got %', length(filter)
            using errcode = '22023', hint = v_hint;
    end if;
    begin
        v_path := filter::jsonpath;
    exception when others then
        raise exception 'pgferry: filter % is not a valid jsonpath: %', quote_literal(filter), sqlerrm
            using errcode = '22023', hint = v_hint;
    end;
    -- Each .** accessor of the normalized text (string literals left out) and its level bound.
    if exists (select 1
               from regexp_matches(regexp_replace(v_path::text, '"([^"\\]|\\.)*"', '""', 'g'),
                                   '\.\*\*(\{[^}]*\})?', 'g') as m(g)
               where m.g[1] is null
                  or coalesce(substring(m.g[1] from '(\d+)\}$')::numeric, 1001) > 1000) then
        raise exception 'pgferry: filter % uses .** without a bound: it descends by recursion, and a deeply '
                        'nested payload would stop the subscription', quote_literal(filter)
            using errcode = '22023',
                  hint = 'Bound its levels to at most 1000, e.g. ''exists($.**{0 to 50} ? (@ == "x"))''. ' || v_hint;
    end if;
    -- Variables of the normalized text ($"name"), each quoted token taken whole from the left, so
    -- that a string literal ending in $ ("abc$") is not read as the start of one.
    select string_agg(distinct '$' || m.g[2], ', ') into v_unknown
    from regexp_matches(v_path::text, '(\$)?"((?:[^"\\]|\\.)*)"', 'g') as m(g)
    where m.g[1] is not null and m.g[2] not in ('stream', 'key', 'headers');
    if v_unknown is not null then
        raise exception 'pgferry: filter % uses an unknown variable: %', quote_literal(filter), v_unknown
            using errcode = '22023', hint = 'The variables are $stream, $key and $headers; the payload is $.';
    end if;
    begin
        perform jsonb_path_match_tz('{}', v_path, '{"stream": "", "key": null, "headers": null}', false),
                jsonb_path_match_tz('{}', v_path, '{"stream": "s", "key": "k", "headers": {}}', false);
    exception
        when undefined_object then  -- could not find jsonpath variable "x"
            raise exception 'pgferry: filter % uses an unknown variable: %', quote_literal(filter), sqlerrm
                using errcode = '22023', hint = 'The variables are $stream, $key and $headers; the payload is $.';
        when others then
            raise exception 'pgferry: filter % is not a predicate (true or false for an event): %',
                    quote_literal(filter), sqlerrm
                using errcode = '22023', hint = v_hint;
    end;
end $$;
