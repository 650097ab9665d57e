-- ferry._filter_match(filter jsonpath, stream text, key text, headers jsonb, payload jsonb) returns boolean
--
-- Whether an event passes a subscription's filter (migration 0012): true
-- when there is no filter or the predicate is true; false when it is false
-- or unknown (a missing field, a type mismatch, an arithmetic error: silent
-- mode never raises for those). The payload is $, and $stream, $key and
-- $headers are the rest of the event (JSON null when the event has no key
-- or headers). The _tz variant compares dates with and without time zone
-- in the session's TimeZone, where the plain one raises even when silent.
-- A SQL function so that it is inlined into the reads that call it.
--
-- Parameters: filter   the subscription's filter; NULL matches everything
--             stream, key, headers, payload   the event
-- Returns:    true when the event is to be delivered.
-- Calls:      -
-- Reads:      -
-- Writes:     -
-- Raises:     42704 for a variable the filter names but the event lacks
--             (refused by ferry._check_filter before a filter is stored)
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._filter_match(filter jsonpath, stream text, key text, headers jsonb, payload jsonb)
returns boolean language sql stable parallel safe as $$
    select filter is null
        or coalesce(jsonb_path_match_tz(payload, filter,
                                        jsonb_build_object('stream', stream, 'key', key, 'headers', headers), true),
                    false)
$$;
