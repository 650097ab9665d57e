-- pgferry 0031: a subscription whose filter names a variable no event has
-- ($x, where only $stream, $key and $headers exist) is disabled, with the
-- reason. ferry._check_filter refuses such filters at subscribe since this
-- release; one stored before raised "could not find jsonpath variable" at
-- every read of its subscription, and the shared read it was part of
-- failed for every subscription in it. Disabled, it is shown by `pgferry
-- status` with what to do, and the others read on. The variables are found
-- the way ferry._check_filter finds them: in the path's normalized text,
-- each quoted token taken whole from the left. Whatever state such a
-- subscription was in (paused, stalled, disabled for another reason), it
-- is disabled with this reason: subscribing again with a fixed filter is
-- the way back for all of them.

update ferry.subscriptions s
set state = 'disabled',
    state_reason = format('its filter uses an unknown variable (%s): the variables are $stream, $key and $headers; '
                          'subscribe again with a fixed filter', u.names),
    updated_at = now()
from (select s2.name, string_agg(distinct '$' || m.g[2], ', ') as names
      from ferry.subscriptions s2,
           regexp_matches(s2.filter::jsonpath::text, '(\$)?"((?:[^"\\]|\\.)*)"', 'g') as m(g)
      where s2.filter is not null and m.g[1] is not null and m.g[2] not in ('stream', 'key', 'headers')
      group by s2.name) u
where s.name = u.name;
