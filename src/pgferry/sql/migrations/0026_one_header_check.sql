-- pgferry 0026: one header check. ferry.subscribe called ferry._check_headers_map
-- and then ferry._check_header_values, which looped over the same map again
-- for the control characters HTTP refuses in a value; now
-- ferry._check_headers_map(headers, strict) does both in one loop (strict for
-- subscriptions; the pg_net API, net._enqueue, stays lenient as pg_net is).
-- Its file defines the new signature; the old one-argument function (a call
-- with one argument would not know which to choose) and
-- ferry._check_header_values go.

drop function if exists ferry._check_headers_map(jsonb);
drop function if exists ferry._check_header_values(jsonb);
