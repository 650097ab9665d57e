-- ferry._check_token_patterns(patterns text[], what text) returns void
--
-- Refuses a list of API token stream patterns that could not be what was
-- meant: more than 100 patterns, or one that is NULL, blank, longer than 200
-- characters or holds a control character (a line break, a tab, ...). The
-- message names the list (what: 'read' or 'write') and the pattern's
-- position. Python checks the same first (pgferry.api_tokens.check_pattern).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._check_token_patterns(patterns text[], what text) returns void
language plpgsql immutable as $$
declare
    v_pattern text;
    v_position integer := 0;
begin
    if cardinality(patterns) > 100 then
        raise exception 'pgferry: a token takes at most 100 % patterns, got %', what, cardinality(patterns)
            using errcode = '22023';
    end if;
    foreach v_pattern in array coalesce(patterns, '{}') loop
        v_position := v_position + 1;
        if v_pattern is null or btrim(v_pattern) = '' then
            raise exception 'pgferry: % pattern #% is empty', what, v_position
                using errcode = '22023', hint = 'A pattern is a stream name, with * for any run of characters and ? for one; * alone is every stream.';
        end if;
        if length(v_pattern) > 200 then
            raise exception 'pgferry: % pattern #% is % characters long; the limit is 200', what, v_position, length(v_pattern)
                using errcode = '22023';
        end if;
        if v_pattern ~ '[\x01-\x1f\x7f-\x9f]' then
            raise exception 'pgferry: % pattern #% holds a control character (a line break, a tab, ...)', what, v_position
                using errcode = '22023';
        end if;
    end loop;
end $$;
