-- ferry.housekeeping() returns text[]
--
-- Everything the elected relay does every few seconds, in one round trip:
-- the stream catalog (first: maintain() may truncate what it has not read
-- yet), rotation and truncation, attempt history, the captures of dropped
-- tables, and (with the pg_net API installed) expired net._http_response rows.
--
-- Parameters: none.
-- Returns:    what it did, one line each, for the relay's log, each
--             starting with its topic ('retention: ', 'capture: ',
--             'attempts: ', 'pg_net: '); the stream catalog says nothing.
-- Calls:      ferry._catalog_streams, ferry.maintain, ferry.prune_attempts, ferry._end_dropped_captures,
--             ferry.prune_net_responses (pg_net add-on).
-- Tables:     those of the functions it calls.
-- Raises:     nothing of its own.
-- Roles:      ferry_relay.

create or replace function ferry.housekeeping() returns text[]
language plpgsql as $$
declare
    v_done text[];
    n integer;
begin
    perform ferry._catalog_streams();
    v_done := array(select 'retention: ' || line from unnest(ferry.maintain()) with ordinality as m(line, i) order by i);
    v_done := v_done || array(select 'capture: ' || line from unnest(ferry._end_dropped_captures()) as c(line));
    n := ferry.prune_attempts();
    if n > 0 then
        v_done := v_done || format('attempts: removed %s old delivery attempts', n);
    end if;
    if to_regproc('ferry.prune_net_responses') is not null then
        execute 'select ferry.prune_net_responses()' into n;
        if n > 0 then
            v_done := v_done || format('pg_net: removed %s expired net._http_response rows', n);
        end if;
    end if;
    return v_done;
end $$;

grant execute on function ferry.housekeeping() to ferry_relay;
