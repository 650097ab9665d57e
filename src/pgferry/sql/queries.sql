-- Named queries used by the Python side. Each starts with "-- name: NAME";
-- the SQL API itself is in functions/, one file per function (its README
-- lists them by purpose).

-- name: install_lock
select pg_advisory_xact_lock($1::int, $2::int)

-- name: create_migrations_table
create schema if not exists ferry;
create table if not exists ferry.schema_migrations (
    version    integer     primary key,
    name       text        not null,
    applied_at timestamptz not null default now()
);

-- name: create_addon_migrations_table
create table if not exists ferry.addon_migrations (
    addon      text        not null,
    version    integer     not null,
    name       text        not null,
    applied_at timestamptz not null default now(),
    primary key (addon, version)
);
-- Every pgferry connection checks the add-ons are up to date (schema.check_installed).
grant select on ferry.addon_migrations to ferry_writer, ferry_relay;

-- name: applied_addon_migrations
select version from ferry.addon_migrations where addon = $1

-- name: record_addon_migration
insert into ferry.addon_migrations (addon, version, name) values ($1, $2, $3)

-- name: pg_net_extension_installed
select exists (select 1 from pg_extension where extname = 'pg_net')

-- name: foreign_net_schema
select exists (select 1 from pg_namespace where nspname = 'net')
   and not exists (select 1 from ferry.addon_migrations where addon = 'pg_net')

-- name: applied_migrations
select version from ferry.schema_migrations

-- name: record_migration
insert into ferry.schema_migrations (version, name) values ($1, $2)

-- name: current_database
select current_database()

-- name: schema_installed
select to_regclass('ferry.schema_migrations') is not null

-- name: schema_version
select max(version) from ferry.schema_migrations

-- name: database_encoding
select pg_encoding_to_char(encoding) from pg_database where datname = current_database()

-- name: writable_here
-- Why this session cannot write (a standby; a role or database whose sessions default to
-- read-only), or NULL.
select case when pg_is_in_recovery() then 'standby'
            when current_setting('transaction_read_only') = 'on' then 'read_only' end

-- name: relays_present
-- The relays connected now (their ownership sessions hold the shared presence lock, $1/$2),
-- with the host and pid each last reported in ferry.relays when its heartbeat is recent.
select l.pid as backend,
       (select string_agg(r.hostname || ':' || r.pid, ', ') from ferry.relays r
        where r.heartbeat_at > now() - interval '1 minute') as reported
from pg_locks l
where l.locktype = 'advisory' and l.classid = $1 and l.objid = $2 and l.objsubid = 2 and l.granted
  and l.database = (select oid from pg_database where datname = current_database())

-- name: try_advisory_lock
select pg_try_advisory_lock($1::int, $2::int)

-- name: consumer_lock_key
select hashtext($1)

-- name: advisory_unlock
select pg_advisory_unlock($1::int, $2::int)

-- name: tick
-- The relay's ticker: a tick when something committed, after WAL capture appended what it sees
-- (migration 0028); $1..$5 the fence and catch-up position the previous call returned (NULL at first).
select tick_id, idle, waiting, written, next_fence::text, next_lsn::text, next_tick, next_at, next_behind::text
from ferry._tick_fenced(force => false, fence => $1::text::pg_snapshot, fence_lsn => $2::text::pg_lsn,
                        fence_tick => $3, fence_at => $4, behind_lsn => $5::text::pg_lsn)

-- name: housekeeping
select ferry.housekeeping()

-- name: after_promotion
-- A new WAL timeline (a promotion, a restore): ids receivers may hold from the lost history are
-- skipped and the instance renamed (migration 0039); a row when that was done now, else none.
select * from ferry.after_promotion()

-- name: publish
select ferry.publish($1, $2::text::jsonb, $3, $4::text::jsonb)

-- name: publish_many
select ferry.publish_many($1, $2::text[]::jsonb[], $3, $4::text[]::jsonb[])

-- name: consumer_streams
select streams from ferry.consumers where name = $1

-- name: register_consumer
select ferry.register_consumer($1, $2, $3)

-- name: unregister_consumer
select ferry.unregister_consumer($1)

-- name: list_consumers
select c.name, c.streams, c.tick_id, c.next_tick_id, c.batch_id, c.updated_at,
       greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq) as approx_lag_events
from ferry.consumers c left join ferry.ticks t0 on t0.id = c.tick_id
order by c.name

-- name: next_batch
select batch_id, start_tick, end_tick, streams from ferry.next_batch($1, $2)

-- name: batch_events
-- The events of a consumer's batch ($1, $2] on its streams $3, as consumer $4 reads them (backfills for others left out).
select id, txid::text::bigint as txid, stream, key, payload, headers, created_at
from ferry.batch_events(start_tick => $1, end_tick => $2, streams => $3, reader => $4)

-- name: finish_batch
select ferry.finish_batch($1, $2)

-- name: relay_round
select live_relays, consumer, part, parts, draining, drained, waiting, (subscription).*
from ferry.relay_round($1, $2, $3, $4, $5::text::jsonb)

-- name: announce_presence
select pg_advisory_lock_shared($1::int, $2::int)

-- name: webhook_steps
-- Acknowledge delivered batches and read the next, for many subscriptions; each read at most $15
-- bytes (a part of a range when one transaction is larger: $17, $18 continue it, per request;
-- $16 sizes each request's range in events; $19, $20: the part of such a range an acknowledgement
-- ends with, kept with the cursor; $9, $11-$13: each run of $21 events of $10 shares them;
-- ferry.webhook_steps' file says how). created_at comes as UTC text (DateStyle ISO:
-- db.DELIVERY_SETTINGS), parsed once per transaction's events (delivery.model.OutEvent.
-- from_batch_row): a timestamptz took asyncpg 2 us a row, a third of decoding a batch.
select reqs, refused, start_tick, end_tick, more, id, stream, key, payload, headers,
       (created_at at time zone 'UTC')::text as created_at, blocked, cut_after
from ferry.webhook_steps(subscriptions => $1, consumers => $2, epochs => $3, ordered => $4,
                         ack_from => $5, ack_to => $6, peeks => $7, peek_after => $8,
                         attempt_req => $9, event_ids => $10, attempt_nos => $11, statuses => $12, latencies => $13,
                         max_events => $14, max_bytes => $15, spans => $16, peek_until => $17, resume_after => $18,
                         ack_part_end => $19, ack_part_done => $20, attempt_runs => $21)

-- name: advance_consumer
select ferry.advance_consumer($1, $2, $3)

-- name: part_progress
-- A part of a range read in parts recorded (with failures parked): where the range is delivered up
-- to, for a worker that starts over (migration 0023). Only while the cursor is at $2.
update ferry.consumers set part_start = $2, part_end = $3, part_done = $4 where name = $1 and tick_id = $2

-- name: park
insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at, attempts,
                           first_failed_at, next_attempt_at, last_status, last_error, last_response)
select $1, u.event_id, u.stream, u.key, u.payload::jsonb, u.headers::jsonb, u.created_at, u.attempts,
       coalesce(u.first_failed_at, now()), u.next_attempt_at, u.status, u.error, u.response
from unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::int[],
            $9::timestamptz[], $10::timestamptz[], $11::int[], $12::text[], $13::text[])
     as u(event_id, stream, key, payload, headers, created_at, attempts, first_failed_at, next_attempt_at,
          status, error, response)
on conflict (subscription, event_id) do update set
    attempts = excluded.attempts, next_attempt_at = excluded.next_attempt_at,
    last_status = excluded.last_status, last_error = excluded.last_error, last_response = excluded.last_response

-- name: bury
insert into ferry.dead_letters (subscription, event_id, stream, key, payload, headers, event_created_at, attempts,
                                first_failed_at, last_status, last_error, last_response)
select $1, u.event_id, u.stream, u.key, u.payload::jsonb, u.headers::jsonb, u.created_at, u.attempts,
       coalesce(u.first_failed_at, now()), u.status, u.error, u.response
from unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::int[],
            $9::timestamptz[], $10::int[], $11::text[], $12::text[])
     as u(event_id, stream, key, payload, headers, created_at, attempts, first_failed_at, status, error, response)
on conflict (subscription, event_id) do nothing

-- name: unpark
delete from ferry.retries where subscription = $1 and event_id = any ($2::bigint[])

-- name: claim_consumers
-- One ownership round's claims (ferry._claim_consumers): $1 the lock class, $2 the consumers in
-- the order to try them, $3 how many to take at most.
select consumer, lock_key, epoch from ferry._claim_consumers($1::int, $2::text[], $3::int)

-- name: fence
select ferry._fence($1, $2)

-- name: drop_drained_consumer
-- A partition that drained after a change of partitions (ferry._subscription_consumers), removed
-- by the relay that owns it once its worker has stopped and recorded everything.
select ferry._drop_drained_consumer($1)

-- name: consumer_tick
select tick_id from ferry.consumers where name = $1

-- name: log_watch
-- The relay's LogWatch in one round trip: the newest tick; the streams with
-- events after tick $1 up to it ('{}' when none is newer; NULL when $1 is NULL
-- or no longer retained, or when no idle subscription is asked about: unknown);
-- which of the idle subscriptions $4 changed since the relay read them (their
-- updated_at is not $5: a stream added a moment ago must not be skipped); and
-- which of the subscriptions $2 (with ordering $3) have a parked event due now
-- (due_retries' condition).
with t as (select max(id) as latest from ferry.ticks)
select t.latest,
       case when $1::bigint is null or cardinality($4::text[]) = 0 then null
            when t.latest = $1 then '{}'::text[]
            else ferry._range_streams($1, t.latest) end as streams,
       array(select i.name from unnest($4::text[], $5::timestamptz[]) as i(name, seen)
             left join ferry.subscriptions s on s.name = i.name
             where s.updated_at is distinct from i.seen) as changed,
       array(select w.name from unnest($2::text[], $3::boolean[]) as w(name, ordered)
             where exists (
                 select 1 from ferry.retries r
                 where r.subscription = w.name and r.next_attempt_at <= now()
                   and (not w.ordered or r.key is null or not exists (
                         select 1 from ferry.retries r2
                         where r2.subscription = r.subscription and hashtextextended(r2.key, 0) = hashtextextended(r.key, 0)
                           and r2.key = r.key and r2.event_id < r.event_id
                           and r2.next_attempt_at > now())))) as due
from t

-- name: retry_in_flight_now
-- Events parked as in flight whose requests a stopping worker abandoned: due now.
update ferry.retries set next_attempt_at = now()
where subscription = $1 and event_id = any ($2::bigint[]) and last_error like 'in flight:%'

-- name: due_retries
-- Parked events due now, in id order, at most $3 of them and $4 bytes of payload (NULL: no
-- bound; at least one event however large; ferry.retries.payload_bytes, migration 0015: no
-- payload is rendered to be measured, and only those returned are rendered). With ordering
-- on ($2), a key's events come in order from its earliest parked one, up to the first that is
-- not due yet (the worker's lanes send them in order and stop a key at its first failure).
-- Only those of partition $5 of $6 (migration 0018: each partition's worker retries its own).
select r.event_id as id, r.stream, r.key, r.payload::text as payload, r.headers::text as headers,
       r.event_created_at as created_at, r.attempts, r.first_failed_at
from (
    select r.event_id, r.stream, r.key, r.payload, r.headers, r.event_created_at, r.attempts, r.first_failed_at,
           sum(r.payload_bytes) over (order by r.event_id rows unbounded preceding) as upto,
           row_number() over (order by r.event_id rows unbounded preceding) as n
    from ferry.retries r
    where r.subscription = $1 and r.next_attempt_at <= now()
      and ($6::int <= 1 or ferry._partition_of(r.key, r.event_id, $6::int) = $5::int)
      and (not $2 or r.key is null or not exists (
            select 1 from ferry.retries r2
            where r2.subscription = r.subscription and hashtextextended(r2.key, 0) = hashtextextended(r.key, 0)
                           and r2.key = r.key and r2.event_id < r.event_id
              and r2.next_attempt_at > now()))
    order by r.event_id
    limit $3
) r
where $4::bigint is null or r.n = 1 or r.upto <= $4
order by r.event_id

-- name: retries_expire
-- While the subscription's endpoint is down its events are held without spending
-- attempts; those whose max_age has passed since they first failed (or were first
-- held) become dead letters here, with the reason. Returns how many.
with expired as (
    delete from ferry.retries r
    using ferry.subscriptions s
    where r.subscription = $1 and s.name = r.subscription and r.first_failed_at < now() - s.max_age
      and ($3::int <= 1 or ferry._partition_of(r.key, r.event_id, $3::int) = $2::int)
      and (r.last_error is null or r.last_error not like 'in flight:%')
    returning r.*, s.max_age
), buried as (
    insert into ferry.dead_letters (subscription, event_id, stream, key, payload, headers, event_created_at, attempts,
                                    first_failed_at, last_status, last_error, last_response)
    select subscription, event_id, stream, key, payload, headers, event_created_at, attempts, first_failed_at,
           last_status, concat_ws('; ', last_error, 'gave up: max_age ' || max_age::text || ' passed'), last_response
    from expired
    on conflict (subscription, event_id) do nothing
    returning 1
)
select count(*) from buried

-- name: retries_probe
-- The parked event a probe of the subscription's down endpoint carries: a due one
-- (each keeps its own backoff) with the fewest attempts, so that an outage's probes
-- spread over the held events instead of using up a few events' attempts. With
-- ordering on ($2), only the earliest parked event of a key. Partition $3 of $4's only.
select r.event_id as id, r.stream, r.key, r.payload::text as payload, r.headers::text as headers,
       r.event_created_at as created_at, r.attempts, r.first_failed_at
from ferry.retries r
where r.subscription = $1 and r.next_attempt_at <= now()
  and (r.last_error is null or r.last_error not like 'in flight:%')
  and ($4::int <= 1 or ferry._partition_of(r.key, r.event_id, $4::int) = $3::int)
  and (not $2 or r.key is null or not exists (
        select 1 from ferry.retries r2
        where r2.subscription = r.subscription and hashtextextended(r2.key, 0) = hashtextextended(r.key, 0)
                           and r2.key = r.key and r2.event_id < r.event_id))
order by r.attempts, r.event_id
limit 1

-- name: retries_release
-- The subscription's endpoint answers again: everything parked is due now (but
-- events whose requests are still in flight, which are recorded when they come).
update ferry.retries r set next_attempt_at = now()
where r.subscription = $1 and r.next_attempt_at > now() and (r.last_error is null or r.last_error not like 'in flight:%')
  and ($3::int <= 1 or ferry._partition_of(r.key, r.event_id, $3::int) = $2::int)

-- name: next_retry_at
-- With ordering on, only the earliest parked event of a key can be due. Partition $3 of $4's only.
select min(r.next_attempt_at) from ferry.retries r
where r.subscription = $1
  and ($4::int <= 1 or ferry._partition_of(r.key, r.event_id, $4::int) = $3::int)
  and (not $2 or r.key is null or not exists (
        select 1 from ferry.retries r2
        where r2.subscription = r.subscription and hashtextextended(r2.key, 0) = hashtextextended(r.key, 0)
                           and r2.key = r.key and r2.event_id < r.event_id))

-- name: disable_subscription
select ferry._set_subscription_state($1, 'disabled', $2)

-- name: relay_gone
delete from ferry.relays where id = $1

-- name: subscription_status
select * from ferry.subscription_status()

-- name: relay_config
-- What a relay reads once at start: the body limit, and the name of this install for the broker
-- sinks' duplicate checks: the install's (migration 0034) and the database's oid, since a database
-- made from another as its template (CREATE DATABASE ... TEMPLATE) copies ferry.config.
select max_body_bytes, instance || '.' || (select d.oid from pg_database d where d.datname = current_database()) as instance
from ferry.config

-- name: subscribe
-- Create or update a webhook subscription (every setting; filter NULL: every event).
select ferry.subscribe($1, $2, $3, batch_size => $4, max_in_flight => $5, ordered => $6, secret => $7,
                       headers => $8::text::jsonb, timeout_ms => $9, max_attempts => $10, max_age => $11::text::interval,
                       retry_base_ms => $12, retry_max_ms => $13, connect_timeout_ms => $14, start_at => $15,
                       filter => $16, partitions => $17)

-- name: unknown_streams
-- Which of the streams $1 nothing has written yet (see migration 0008), in the order given.
select ferry._unknown_streams($1::text[])

-- name: subscriptions_unknown_streams
-- Per subscription named in $1: its streams nothing has written yet (for status).
select s.name, ferry._unknown_streams(s.streams) as unknown
from ferry.subscriptions s where s.name = any ($1::text[])

-- name: unsubscribe
select ferry.unsubscribe($1)

-- name: pause_subscription
select ferry.pause_subscription($1)

-- name: resume_subscription
-- Resume a subscription; $2 where a stalled one reads on ('retained' or 'now'; NULL for one that is not stalled).
select ferry.resume_subscription(name => $1, from_position => $2)

-- name: resume_consumer
-- End a consumer's stall, reading on from $2: 'retained' or 'now'; returns the events that skips.
select ferry.resume_consumer(name => $1, from_position => $2)

-- name: retention_status
-- Per consumer: cursor age, bytes held, share of the retention limit, stalled or not, gaps (migration 0014).
select * from ferry.retention_status()

-- name: retention_set
-- Set the retention limit whole: $1 max_retention (interval text), $2 max_retention_bytes (NULL: no size cap).
select ferry.set_retention(max_retention => $1::text::interval, max_retention_bytes => $2)

-- name: retention_config
-- The retention settings, for `pgferry retention`.
select rotation_interval::text as rotation_interval, max_retention::text as max_retention, max_retention_bytes
from ferry.config

-- name: gaps_list
-- Recorded gaps, newest first, of consumer $1 (NULL: every consumer), at most $2.
select id, consumer, subscription, from_tick, to_tick, events, first_event_id, last_event_id, oldest_event_at,
       newest_event_at, cause, reason, recorded_at, updated_at, from_lsn::text as from_lsn, to_lsn::text as to_lsn
from ferry.gaps where ($1::text is null or consumer = $1) order by id desc limit $2

-- name: gaps_of_event
-- The gaps whose event id range holds event $1: the subscriptions and consumers that never got it.
select g.id, g.consumer, g.subscription, g.events, g.from_tick, g.to_tick, g.first_event_id, g.last_event_id,
       g.cause, g.reason, g.recorded_at
from ferry.gaps g where $1 between g.first_event_id and g.last_event_id order by g.id

-- name: list_subscriptions
select name, streams, url, headers, cardinality(secrets) as secrets, batch_size, max_in_flight, ordered, timeout_ms,
       connect_timeout_ms, max_attempts, max_age::text as max_age, retry_base_ms, retry_max_ms, filter, partitions,
       state, state_reason, created_at, updated_at
from ferry.subscriptions order by name

-- name: dlq_list
select id, subscription, event_id, stream, key, attempts, first_failed_at, died_at, last_status, last_error,
       left(last_response, 200) as last_response
from ferry.dead_letters
where ($1::text is null or subscription = $1)
order by id
limit $2

-- name: dlq_replay
select ferry.dlq_replay($1, $2)

-- name: dlq_discard
select ferry.dlq_discard($1, $2)

-- name: net_requests_queued
-- Which of these pg_net requests are still queued (the others were cancelled).
select id from net.http_request_queue where id = any ($1::bigint[])

-- name: net_requests_done
-- Finished pg_net requests leave the queue with their response row.
delete from net.http_request_queue where id = any ($1::bigint[])

-- name: installed_addons
select addon, max(version) as version from ferry.addon_migrations group by addon

-- name: addon_migrations_table_exists
select to_regclass('ferry.addon_migrations') is not null

-- name: function_versions
-- Every function of pgferry's schemas but those named like $1 (generated ones), with the version
-- of its catalog row (schema._function_versions).
select p.oid::int8 as oid, p.xmin::text as version, n.nspname || '.' || p.proname as name
from pg_proc p join pg_namespace n on n.oid = p.pronamespace
where n.nspname in ('ferry', 'net', 'supabase_functions') and p.proname !~ $1
  and not exists (select 1 from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid
                                              and d.deptype = 'e')

-- name: stale_trigger_captures
-- The trigger captures whose generated functions an earlier ferry._capture_generator() made, by
-- oid (a table renamed since its capture included): install regenerates them, one by one.
select cap.id, cap.relid::regclass::text as tbl
from ferry.captures cap
where cap.uncaptured_at is null and cap.method = 'trigger'
  and exists (select 1 from pg_class r where r.oid = cap.relid)
  and exists (select 1 from unnest(cap.operations) op
              where coalesce(obj_description(to_regprocedure(ferry._capture_function(cap.relid::regclass, op) || '()'),
                                             'pg_proc'), '')
                    not like format('%%(generator %s)', ferry._capture_generator()))
order by cap.id

-- name: regenerate_trigger_capture
select ferry._regenerate_trigger_capture($1)

-- name: drop_function_statement
-- The statement that drops function $1 (an oid; install: one no file defines any more)
select format('drop function %s', $1::oid::regprocedure)

-- name: record_net_responses
insert into net._http_response (id, status_code, content_type, headers, content, timed_out, error_msg)
select * from unnest($1::bigint[], $2::int[], $3::text[], $4::text[]::jsonb[], $5::text[], $6::boolean[], $7::text[])
on conflict (id) do nothing

-- ---------------------------------------------------------------------------
-- Operator queries: status, trace, tail, dead letters, replay, apply, dashboard
-- ---------------------------------------------------------------------------

-- name: endpoint_health
-- The newest attempt of each subscription, and its newest success, from the
-- attempt history (indexes attempts_subscription_idx and
-- deliveries_subscription_idx): what "endpoint health" means.
select s.name,
       la.created_at as last_attempt_at, la.status as last_status, la.error_class as last_error_class,
       la.error as last_error, ok.created_at as last_success_at
from ferry.subscriptions s
left join lateral (
    select x.* from (
        (select a.created_at, a.status, a.error_class, a.error from ferry.attempts a
         where a.subscription = s.name order by a.created_at desc limit 1)
        union all
        (select d.created_at, d.status, null, null from ferry.deliveries d
         where d.subscription = s.name order by d.created_at desc limit 1)) x
    order by x.created_at desc limit 1) la on true
left join lateral (
    select max(x.created_at) as created_at from (
        (select a.created_at from ferry.attempts a
         where a.subscription = s.name and a.error_class is null order by a.created_at desc limit 1)
        union all
        (select d.created_at from ferry.deliveries d
         where d.subscription = s.name order by d.created_at desc limit 1)) x) ok on true
order by s.name

-- name: endpoints_down
-- Subscriptions whose endpoint a live relay holds as down (events held, probing), and since when.
select d.key as name, d.value::timestamptz as down_since
from ferry.relays r, jsonb_each_text(r.stats -> 'endpoint_down') d
where r.heartbeat_at > now() - interval '15 seconds'

-- name: relays_status
-- A silent relay delivers nothing: its last owned list is not shown (a relay SIGKILLed half an
-- hour before was listed delivering partitions removed since; outside probe).
select r.id, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       extract(epoch from now() - r.heartbeat_at)::float8 as heartbeat_age_s,
       h.live, case when h.live then r.owned else '{}' end as owned
from ferry.relays r
cross join lateral (select r.heartbeat_at > now() - interval '15 seconds' as live) h
order by r.started_at

-- name: captures_current
-- The tables captured now (ferry.capture_table), with the stream and filters each was given,
-- for pgferry status: by the table's name now (renamed since: status showed the old one, which
-- `capture --remove` and `backfill` then refused; outside probe) and the name it was captured
-- under (captured_as), which its events still carry until it is captured again.
select coalesce(format('%I.%I', n.nspname, k.relname), c.schema_name || '.' || c.table_name) as table_name,
       c.schema_name || '.' || c.table_name as captured_as, c.stream, c.operations, c.condition, c.columns,
       c.exclude_columns, c.changed_columns, c.created_at, c.method
from ferry.captures c
left join pg_catalog.pg_class k on k.oid = c.relid
left join pg_catalog.pg_namespace n on n.oid = k.relnamespace
where c.uncaptured_at is null
order by 1

-- name: replica_role_settings
-- Role and database settings (pg_db_role_setting) and the server's own that put writers of this
-- database in session_replication_role = replica, where no trigger fires: trigger capture misses
-- their writes without a word (outside probe). Each with the statement that undoes it.
select coalesce(r.rolname, 'every role') as who,
       case when s.setdatabase = 0 then 'every database' else 'this database' end as where_set,
       case when s.setrole = 0 and s.setdatabase = 0 then 'alter role all reset session_replication_role'
            when s.setrole = 0 then format('alter database %I reset session_replication_role', current_database())
            when s.setdatabase = 0 then format('alter role %I reset session_replication_role', r.rolname)
            else format('alter role %I in database %I reset session_replication_role', r.rolname, current_database())
       end as undo
from pg_catalog.pg_db_role_setting s
left join pg_catalog.pg_roles r on r.oid = s.setrole
where s.setdatabase in (0, (select d.oid from pg_catalog.pg_database d where d.datname = current_database()))
  and exists (select 1 from unnest(s.setconfig) g where lower(g) in ('session_replication_role=replica'))
union all
select 'every role', 'the server''s configuration (' || coalesce(p.sourcefile, p.source) || ')',
       'alter system reset session_replication_role (or edit the configuration file), then reload'
from pg_catalog.pg_settings p
where p.name = 'session_replication_role' and p.source in ('configuration file', 'command line', 'environment variable')
  and p.setting = 'replica'

-- name: lookup_event
-- One event as readers see it, with the consumer it is targeted at (NULL: everyone).
select id, txid::text::bigint as txid, stream, key, payload, headers, created_at, target
from ferry.lookup_event(event_id => $1)

-- name: parked_or_dead_copy
-- An event that retention dropped from the log survives as the copy kept with a
-- parked retry or a dead letter.
select event_id as id, null::bigint as txid, stream, key, payload, headers, event_created_at as created_at
from (select event_id, stream, key, payload, headers, event_created_at from ferry.retries where event_id = $1
      union all
      select event_id, stream, key, payload, headers, event_created_at from ferry.dead_letters where event_id = $1) x
limit 1

-- name: trace_subscriptions
-- Per subscription that matched the event (or holds any trace of it): where the
-- event is. $1 event id, $2 its stream, $3 its txid (NULL once retention
-- dropped it from the log, which only happens after every cursor passed it),
-- $4 its key, $5 its payload, $6 its headers: a passed event with no
-- attempt that the subscription's filter (as it is now) does not match was
-- filtered out by it;
-- $7 the consumer a backfill event is targeted at (NULL: everyone).
select s.name, s.state as subscription_state,
       case when d.id is not null then 'dead'
            when $7::text is not null and $7::text <> 'webhook:' || s.name
                 then 'not for this subscription (a backfill for ' || $7::text || ')'
            when r.event_id is not null and r.attempts = 0 and r.last_error = 'replayed by an operator' then 'replay queued'
            when r.event_id is not null and r.last_status is null and r.last_error like 'in flight:%' then 'in flight (its batch moved on)'
            when r.event_id is not null and r.last_status is null and r.last_error like 'held:%' then 'held (endpoint down)'
            when r.event_id is not null and r.attempts = 0 then 'waiting (behind an earlier event of its key)'
            when r.event_id is not null then 'parked'
            when $3::bigint is not null and t.snapshot is not null
                 and not pg_visible_in_snapshot($3::text::xid8, t.snapshot) then 'pending'
            when la.attempted and la.error_class is null then 'delivered'
            when la.attempted then 'passed (last attempt failed)'
            when not ferry._filter_match(s.filter::jsonpath, $2, $4, $6::jsonb, $5::jsonb)
                 then 'filtered out by subscription ' || s.name
            else 'passed (no attempt recorded: subscribed later, or history pruned)'
       end as state,
       coalesce(r.attempts, d.attempts) as attempts_so_far, r.next_attempt_at, d.id as dead_letter_id, d.died_at,
       coalesce(d.last_status, r.last_status) as last_status, coalesce(d.last_error, r.last_error) as last_error
from ferry.subscriptions s
left join lateral (  -- the cursor of the partition that delivers it (migration 0018)
    select min(c.tick_id) as tick_id from ferry.consumers c
    where c.subscription = s.name and ferry._partition_of($4, $1, c.parts) = c.part) c on true
left join ferry.ticks t on t.id = c.tick_id
left join ferry.retries r on r.subscription = s.name and r.event_id = $1
left join ferry.dead_letters d on d.subscription = s.name and d.event_id = $1
left join lateral (  -- its newest attempt: a failure (ferry.attempts) or a delivery (ferry.deliveries)
    select true as attempted, x.error_class from (
        (select a.id, a.error_class from ferry.attempts a
         where a.subscription = s.name and a.event_id = $1 order by a.id desc limit 1)
        union all
        (select d.id, null from ferry.deliveries d
         where d.subscription = s.name and d.events @> $1::bigint and $1 = any (d.event_ids)
         order by d.id desc limit 1)) x
    order by x.id desc limit 1) la on true
where $2 = any (s.streams) or r.event_id is not null or d.id is not null or la.attempted
order by s.name

-- name: trace_attempts
-- An event's attempts: its rows of ferry.attempts and the ferry.deliveries rows whose range holds it
-- (index deliveries_events_idx), in the order they were recorded.
select x.subscription, x.attempt, x.status, x.error_class, x.error, x.response, x.latency_ms, x.created_at
from (
    select a.id, a.subscription, a.attempt, a.status, a.error_class, a.error, left(a.response, $2) as response,
           a.latency_ms, a.created_at
    from ferry.attempts a where a.event_id = $1 and ($3::text is null or a.subscription = $3)
    union all
    select d.id, d.subscription, d.attempt, d.status, null, null, null, d.latencies_ms[array_position(d.event_ids, $1)],
           d.created_at
    from ferry.deliveries d
    where d.events @> $1::bigint and $1 = any (d.event_ids) and ($3::text is null or d.subscription = $3)) x
order by x.id

-- name: dlq_show
select id, subscription, event_id, stream, key, payload, headers, event_created_at, attempts, first_failed_at,
       died_at, last_status, last_error, last_response
from ferry.dead_letters where id = $1

-- name: latest_tick
select max(id) from ferry.ticks

-- name: tick_exists
select exists (select 1 from ferry.ticks where id = $1)

-- name: replay_count
select ferry.replay_count($1, $2, $3)

-- name: replay_chunk
select queued, skipped, last_tick, end_tick from ferry.replay($1, $2, $3, $4, $5, $6)

-- name: subscription_settings
-- What `pgferry apply` compares a file against; secrets and credentials only to compare, never shown.
select s.name, s.streams, s.url, s.headers, s.secrets, s.credentials, s.batch_size, s.max_in_flight, s.ordered, s.timeout_ms,
       s.connect_timeout_ms, s.max_attempts, s.max_age, s.retry_base_ms, s.retry_max_ms, s.filter, s.partitions,
       s.managed_by
from ferry.subscriptions s where coalesce(to_jsonb(s) ->> 'kind', 'webhook') = 'webhook'
order by name

-- name: set_managed_by
update ferry.subscriptions set managed_by = $2 where name = $1 and managed_by is distinct from $2

-- name: set_secrets
select ferry.set_subscription_secrets($1, $2)

-- name: set_credentials
select ferry.set_subscription_credentials($1, $2::text::jsonb)

-- name: normalize_interval
select $1::text::interval

-- name: apply_lock
-- `pgferry apply`'s lock ($1 classid, $2 objid), held to the end of its transaction: applies at once
-- run one after the other, each planned against what the one before it committed.
select pg_advisory_xact_lock($1::int, $2::int)

-- name: check_secret
-- Refuse a signing secret as ferry.set_subscription_secrets would (apply says which variable held it).
select ferry._check_secret($1)

-- name: subscription_losses
-- What removing each subscription named in $1 deletes with it: parked retries and dead letters.
select n.name,
       (select count(*) from ferry.retries r where r.subscription = n.name) as parked,
       (select count(*) from ferry.dead_letters d where d.subscription = n.name) as dead
from unnest($1::text[]) as n (name)

-- name: recent_failures
select a.id, a.subscription, a.event_id, a.attempt, a.status, a.error_class, a.error,
       left(a.response, 300) as response, a.latency_ms, a.created_at
from ferry.attempts a
where a.error_class is not null and ($1::text is null or a.subscription = $1)
order by a.id desc
limit $2

-- name: subscription_url
select url from ferry.subscriptions where name = $1

-- name: subscription_exists
-- Whether subscription $1 exists (the CLI's commands on one that found nothing say which name is unknown).
select exists (select 1 from ferry.subscriptions where name = $1)

-- name: api_token_create
-- A new API token (its hash, never the token), by `pgferry token create`; returns its id.
select ferry.token_create(name => $1, token_hash => $2, read_patterns => $3, write_patterns => $4)

-- name: api_token_revoke
-- Revoke the live token of that name (`pgferry token revoke`).
select ferry.token_revoke(name => $1)

-- name: api_token_list
-- API tokens for `pgferry token list`, live ones only unless $1; never the hash.
select name, read_patterns, write_patterns, created_at, created_by, last_used_at, revoked_at
from ferry.api_tokens
where $1::boolean or revoked_at is null
order by name, created_at

-- name: api_token_load
-- The live API tokens, for the relay's TokenStore (one query per refresh). Marks the tokens it saw used
-- since the last refresh ($1, ids) as used now, at most once a minute each; touch_due says, per token,
-- whether its next use should be noted.
with touched as (
    update ferry.api_tokens t set last_used_at = now()
    where t.id = any($1::bigint[]) and t.revoked_at is null
      and (t.last_used_at is null or t.last_used_at < now() - interval '1 minute')
)
select id, name, token_hash, read_patterns, write_patterns,
       (id <> all($1::bigint[]) and (last_used_at is null or last_used_at < now() - interval '1 minute')) as touch_due
from ferry.api_tokens
where revoked_at is null

-- ---------------------------------------------------------------------------
-- Durable streams: readers that follow a stream by name (pgferry.streams)
-- ---------------------------------------------------------------------------

-- name: stream_oldest_tick
-- The tick the oldest retained events committed after: what "from the start" means.
select coalesce((select min(p.open_tick) from ferry.partitions p where p.state <> 'empty'),
                (select max(t.id) from ferry.ticks t))

-- name: stream_start
-- Where a reader of stream $1 starts, in one round trip (10,000 clients may connect at once):
-- its end marker's id (NULL while open); the oldest retained tick (what "from the start" means);
-- whether retention dropped the whole closed stream (the oldest tick sees the close committed);
-- the tick its first event committed after, from the stream catalog (migration 0010), never
-- before the oldest; the tick right before $2 (a reader resuming inside tick $2 reads from there); and
-- the newest tick (an offset past it is from another database, or from before a restore).
with oldest as (
    select coalesce((select min(p.open_tick) from ferry.partitions p where p.state <> 'empty'),
                    (select max(t.id) from ferry.ticks t)) as tick
)
select c.end_event,
       o.tick as oldest,
       coalesce(pg_visible_in_snapshot(c.end_txid, (select t.snapshot from ferry.ticks t where t.id = o.tick)),
                false) as dropped,
       greatest(o.tick, case when s.stream is not null then s.first_tick
                             else (select p.scanned_tick from ferry.stream_scan p) end) as first_tick,
       (select max(t.id) from ferry.ticks t where t.id < $2) as tick_before,
       (select max(t.id) from ferry.ticks t) as newest
from oldest o
left join ferry.closed_streams c on c.stream = $1
left join ferry.streams s on s.stream = $1

-- name: stream_range_end
-- How far one read after tick $1 goes: about $2 events of the log, at least one tick; NULL: no newer tick.
select ferry._batch_end($1, $2)

-- name: stream_ticks
-- The ticks of the range ($1, $2], with their snapshots, to find each event's commit tick.
select t.id, t.snapshot::text as snapshot from ferry.ticks t where t.id > $1 and t.id <= $2 order by t.id

-- name: stream_events
-- One stream's events committed in the range ($1, $2], each payload as its JSON text (the HTTP API
-- writes it out as it is; read_stream decodes it, as fast as the jsonb codec).
select id, txid::text::bigint as txid, stream, key, payload::text as payload, headers, created_at
from ferry.batch_events($1, $2, array[$3::text])

-- name: stream_range_size
-- How many ticks the range ($1, $2] has, and about how many log events it holds (event ids handed
-- out between its ticks).
select count(*) as ticks, max(t.event_seq) - (select b.event_seq from ferry.ticks b where b.id = $1) as events
from ferry.ticks t where t.id > $1 and t.id <= $2

-- name: stream_events_by_id
-- One stream's events committed in the range ($1, $2] with an id above $4, in id order: the commit
-- order of a range of one tick (streams.reader.read_tick_in_pages reads such a range through a
-- cursor; $4 is where in the tick a reader resumes), each payload as its JSON text.
select id, key, payload::text as payload, headers, created_at
from ferry.batch_events($1, $2, array[$3::text])
where id > $4
order by id

-- name: close_stream
select ferry.close_stream($1)

-- name: stream_publish
-- The HTTP API's publish of payloads $2 (keys $3, headers $4) to stream $1, in one statement:
-- their ids, or none and the table whose capture writes the stream now (`captured`): the API
-- publishes into no such stream, whose events would look like the table's changes (ferry.publish
-- itself refuses none: its SQL callers may).
with captured as (
    select format('%I.%I', c.schema_name, c.table_name) as tbl from ferry.captures c
    where c.stream = $1 and c.uncaptured_at is null
    limit 1
)
select (select tbl from captured) as captured,
       array(select ferry.publish_many(array_fill($1::text, array[cardinality($2::text[])]), $2::text[]::jsonb[],
                                       $3, $4::text[]::jsonb[])
             where not exists (select from captured)) as ids

-- name: streams_events
-- The events of several streams committed in the range ($1, $2] (the stream hub's live feed),
-- each payload as its JSON text (the HTTP API writes it out as it is).
select id, txid::text::bigint as txid, stream, key, payload::text as payload, headers, created_at
from ferry.batch_events($1, $2, $3::text[])

-- name: backfill_create
-- Start a backfill of table $1 for subscription $2 or consumer $3 (neither: everyone), rows matching $4, $5 rows a chunk.
select ferry.backfill(tbl => $1::text::regclass, subscription => $2, consumer => $3, condition => $4,
                      chunk_size => $5)

-- name: backfill_chunk
-- One chunk of backfill $1, in its own transaction: the state after it ('busy': another runner has it right now).
select state, rows_done, rows_estimate, chunk_rows from ferry.backfill_chunk(backfill => $1)

-- name: backfill_set_state
-- Cancel ($2 = 'cancel'), pause or resume backfill $1 (with chunks of $3 rows from now on, when
-- not NULL); the state afterwards.
select case $2::text when 'cancel' then ferry.backfill_cancel(backfill => $1)
                     when 'pause' then ferry.backfill_pause(backfill => $1)
                     when 'resume' then ferry.backfill_resume(backfill => $1, chunk_size => $3::integer) end

-- name: backfill_progress
-- Backfills with their progress: $1 one id, or NULL for every one that is running or paused, or finished within $2.
select b.id, format('%I.%I', b.schema_name, b.table_name) as table_name, b.target, b.condition, b.chunk_size,
       b.rows_done, b.rows_estimate, b.state, b.reason, b.started_at, b.updated_at, b.finished_at, b.created_by,
       extract(epoch from clock_timestamp() - b.updated_at)::float8 as idle_seconds
from ferry.backfills b
where case when $1::bigint is not null then b.id = $1
           else b.state in ('running', 'paused') or b.finished_at > clock_timestamp() - $2::interval end
order by b.id

-- name: keepalive
-- A leadership session's word while it has nothing else to say (idle_session_timeout ends silent ones).
select 1

-- name: wal_slot
-- WAL capture's slot (capture/wal.py), and what is wrong with it, if anything; why appending
-- last failed (cleared by the next append that commits); the positions of changes the operator chose to
-- skip (ferry.skip_wal_change, migration 0037).
select w.slot_name, w.publication, w.lsn::text as lsn, w.error, coalesce(w.skip_lsns::text[], '{}') as skip_lsns,
       case when s.slot_name is null then format('the replication slot %s is gone', w.slot_name)
            when s.wal_status = 'lost' then format('PostgreSQL invalidated the replication slot %s (max_slot_wal_keep_size)', w.slot_name)
       end as problem
from ferry.wal_slot w left join pg_replication_slots s on s.slot_name = w.slot_name

-- name: wal_slot_lost
-- WAL capture's slot is lost ($1 says how): noted in ferry.wal_slot and a gap of each consumer of a
-- WAL-captured stream (migration 0025); the note, with the way out.
select ferry._record_wal_loss(problem => $1)

-- name: wal_failing
-- WAL capture cannot append the next change: why (migration 0021); kept since the first failure.
update ferry.wal_slot set error = $1, error_at = coalesce(error_at, now())

-- name: wal_capture_has_condition
-- Whether capture $1 has a condition (WAL capture's failure message offers to correct it only then).
select exists (select 1 from ferry.captures c where c.id = $1::integer and c.condition is not null)

-- name: wal_generated_functions
-- The stored generated columns of table $1 that call functions outside pg_catalog which do not set
-- their own search_path (what WAL capture, computing them again in a pg_catalog-only session, may
-- fail on), each with its expression and those functions.
select a.attname::text as col, pg_get_expr(d.adbin, d.adrelid) as expr,
       array(select p.oid::regprocedure::text
             from pg_depend dep join pg_proc p on p.oid = dep.refobjid
             where dep.classid = 'pg_attrdef'::regclass and dep.objid = d.oid
               and dep.refclassid = 'pg_proc'::regclass and p.pronamespace <> 'pg_catalog'::regnamespace
               and not exists (select 1 from unnest(coalesce(p.proconfig, '{}')) c where c like 'search_path=%')
             order by 1) as functions
from pg_attribute a join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
where a.attrelid = $1::oid and a.attgenerated = 's' and not a.attisdropped
  and exists (select 1 from pg_depend dep join pg_proc p on p.oid = dep.refobjid
              where dep.classid = 'pg_attrdef'::regclass and dep.objid = d.oid
                and dep.refclassid = 'pg_proc'::regclass and p.pronamespace <> 'pg_catalog'::regnamespace
                and not exists (select 1 from unnest(coalesce(p.proconfig, '{}')) c where c like 'search_path=%'))
order by a.attnum

-- name: wal_rows_as_jsonb
-- Raises when one of the rows $1 (WAL capture's decoded rows, as text) cannot be jsonb: which change
-- of a failed append the log cannot hold.
select cardinality($1::text[]::jsonb[])

-- name: wal_skip
-- Of the changes $1.. decoded at positions the operator chose to skip, which to leave out of the append (those the
-- log cannot hold), each recorded as a gap of its readers in this transaction (ferry._record_wal_skip, migration 0037).
select ferry._record_wal_skip(lsns => $1::text[]::pg_lsn[], relids => $2::oid[], ops => $3::text[], rows => $4::text[],
                              olds => $5::text[], keys => $6::jsonb[], committed_at => $7::timestamptz[])

-- name: wal_recovered
update ferry.wal_slot set error = null, error_at = null where error is not null

-- name: wal_identity_problems
-- Whether the WAL-captured table $1 (or a partition) has a REPLICA IDENTITY that no longer gives what its
-- capture needs, with the fix.
select tbl::text as tbl, problem from ferry._wal_identity_problems(relid => $1::oid::regclass)

-- name: wal_json_domains
-- Of the types $1, the domains over json or jsonb (through domains over domains): WAL capture
-- writes their values into the row as JSON, as it does json's and jsonb's.
with recursive d(oid, base) as (
    select t.oid, t.typbasetype from pg_type t where t.oid = any($1::oid[]) and t.typtype = 'd'
    union all
    select d.oid, t.typbasetype from d join pg_type t on t.oid = d.base where t.typtype = 'd'
)
select coalesce(array_agg(d.oid), '{}') from d where d.base in (114, 3802)

-- name: wal_append
-- Appends decoded changes under their source transactions' ids ($11); $12 ends the round (migration 0028).
select ferry._append_wal_v2(from_lsn => $1::text::pg_lsn, to_lsn => $2::text::pg_lsn, committed_at => $3,
                            relids => $4::oid[], ops => $5::text[]::"char"[], rows => $6::jsonb[], olds => $7::jsonb[],
                            missing => $8::jsonb[], times => $9::timestamptz[], lsns => $10::bigint[],
                            xids => $11::bigint[], round_xids => $12::bigint[])

-- name: capture_table
select ferry.capture_table($1::text::regclass, stream => $2, key_columns => $3, condition => $4, columns => $5,
                           exclude_columns => $6, method => $7, changed_columns => $8,
                           operations => coalesce($9, array['insert', 'update', 'delete']))

-- name: uncapture_table
-- Whether the table was captured (its capture ends here), then the end of it.
select exists (select 1 from ferry.captures where relid = $1::text::regclass and uncaptured_at is null)
from (select ferry.uncapture_table($1::text::regclass)) ended

-- name: wal_status
-- WAL capture's slot for status and metrics: how far the log is behind the WAL, in bytes (what
-- the slot keeps PostgreSQL from recycling) and in seconds (since the relay last caught up,
-- when there is something left to read), and what is wrong, if anything.
select w.slot_name, w.lsn::text as lsn_in_log, s.wal_status,
       coalesce(pg_current_wal_lsn() - s.confirmed_flush_lsn, 0)::bigint as lag_bytes,
       case when s.confirmed_flush_lsn is null or pg_current_wal_lsn() - s.confirmed_flush_lsn > 65536
            then extract(epoch from now() - w.caught_up_at)::float8 else 0 end as lag_seconds,
       w.committed_at, w.invalidated_at, w.note, w.error, w.error_at, w.skip_lsns::text[] as skip_lsns,
       (w.invalidated_at is not null or s.wal_status is null or s.wal_status = 'lost') as stopped,
       (select count(*) from ferry.captures c where c.method = 'wal' and c.uncaptured_at is null) as tables,
       array(select format('%s: %s', p.tbl, p.problem) from ferry._wal_identity_problems() p) as identity_problems
from ferry.wal_slot w left join pg_replication_slots s on s.slot_name = w.slot_name
