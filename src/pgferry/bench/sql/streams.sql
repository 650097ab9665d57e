-- Named queries of `pgferry bench streams`. Each starts with "-- name: NAME".

-- name: published_per_stream
-- Events committed to the streams named like $1 (a LIKE pattern), end markers not counted.
select stream, count(*)::bigint as n
from ferry.events
where stream like $1 and not coalesce(headers ? 'pgferry-control', false)
group by stream

-- name: close_streams
-- End every stream of $1, in one transaction.
select count(ferry.close_stream(s)) from unnest($1::text[]) as s

-- name: load_chunk
-- $2 events of stream $1 in one transaction (the catch-up's history), payloads numbered from $3.
select count(*) from ferry.publish_many(
    array_fill($1::text, array[$2::int]),
    array(select jsonb_build_object('n', n, 'text', 'a token of an answer, streamed')
          from generate_series($3::bigint, $3::bigint + $2 - 1) as n order by n))

-- name: force_tick
select ferry.tick(true)

-- name: backend_pid
select pg_backend_pid()

-- name: create_writer_role
-- The writers' own login role (a member of ferry_writer, as an application's would be), so that
-- pg_stat_statements tells their statements from the relay's.
do $$
begin
    if not exists (select from pg_roles where rolname = 'pgferry_bench_writer') then
        create role pgferry_bench_writer login;
    end if;
end $$;
grant ferry_writer to pgferry_bench_writer

-- name: drop_writer_role
drop role if exists pgferry_bench_writer

-- name: statement_calls
-- Calls and execution time (ms) per statement in database $1 so far, and whether role $2 (the
-- writers) made them.
select s.query, r.rolname = $2 as writer, sum(s.calls)::bigint as calls, sum(s.total_exec_time) as ms
from pg_stat_statements s
join pg_database d on d.oid = s.dbid
join pg_roles r on r.oid = s.userid
where d.datname = $1
group by 1, 2

-- name: vacuum_events
-- After loading the catch-up's history: what autovacuum would otherwise do while it is read.
vacuum (analyze) ferry.events
