-- pgferry 0008: say so when a subscription names a stream nothing has written.
--
-- Supersedes ferry.subscribe of 0004_roles.sql (itself replacing 0002) and
-- ferry.housekeeping of 0002_webhooks.sql. Both keep their signature, their
-- privileges (CREATE OR REPLACE keeps a function's ACL; the grants are
-- restated below all the same) and everything they did; subscribe now also
-- raises a NOTICE per unwritten stream, and housekeeping also keeps the
-- stream catalog below.
--
-- A subscription to "public.ordrs" used to be accepted without a word and
-- then sat idle forever. It is still accepted (a stream may legitimately be
-- written for the first time later), but subscribe now says, as a NOTICE,
-- which of its streams nothing has written yet, and `pgferry status` shows it
-- next to such a subscription's idle state.
--
-- A stream is known when a captured table writes it (ferry.captures), when it
-- is 'net.http' and the pg_net add-on is installed, or when the log holds an
-- event of it. The log has no index on stream, and adding one would cost
-- every writer. Without one, `exists (select 1 from ferry.events where
-- stream = $1)` must read the whole log when the stream is absent, which is
-- exactly the case in question: measured on a 1,000,000-event log (361 MB,
-- 2 cores, warm cache) it took 130-205 ms with a parallel sequential scan,
-- and it grows with the log (retention keeps whatever consumers have not
-- passed) and with the status page, which would pay it again on every
-- refresh. Bounding it to recent partitions is no better: the current
-- partition grows without bound while any consumer lags behind.
--
-- So the relay keeps a small catalog of streams, off the writer's path:
-- ferry.streams holds every stream an event was ever seen in, and
-- ferry.stream_scan the snapshot up to which the log has been catalogued.
-- housekeeping (the elected relay, every 5 s) reads the events committed
-- since, through the txid index, exactly as a batch is read, and adds their
-- streams. The check is then a primary-key lookup plus a txid-index range
-- scan of the events committed since the last housekeeping (a few seconds'
-- worth), and it is sound: an event visible in the catalogued snapshot was
-- catalogued (the first snapshot is taken before the seeding scan below, and
-- every later scan covers what became visible since the previous one), and
-- an event not visible in it has a txid at or above that snapshot's xmax or
-- in its xip list, which the range scan covers. The catalog also remembers
-- streams whose events retention has since dropped (housekeeping catalogues
-- before it truncates), which only ever says "known", never the reverse.
-- Measured on the same log: the check takes about 1 ms; catalogued by housekeeping,
-- 200,000 new events (2,000 transactions) took 131 ms, i.e. one more read of
-- each event by the relay at ~0.65 us (a batch read costs ~5 us per event,
-- see 0007). Without a running relay nothing is catalogued, and the check
-- reads what was written since (63 ms for those 200,000 events).

create table ferry.streams (
    stream          text        primary key,
    first_event_at  timestamptz not null
);

comment on table ferry.streams is
    'pgferry: every stream an event was ever written to, kept by ferry.housekeeping (see migration 0008).';

create table ferry.stream_scan (
    singleton   boolean     primary key default true check (singleton),
    scanned_to  pg_snapshot not null,
    scanned_at  timestamptz not null default now()
);

comment on table ferry.stream_scan is
    'pgferry: the snapshot up to which ferry.streams has catalogued the log.';

-- The snapshot first, then the log: whatever it shows as committed is seen by the scan after it.
insert into ferry.stream_scan (scanned_to) values (pg_current_snapshot());
insert into ferry.streams (stream, first_event_at)
select e.stream, min(e.created_at) from ferry.events e group by e.stream;

---------------------------------------------------------------------------
-- ferry._catalog_streams()
--
-- Adds to ferry.streams the streams of the events committed since the
-- snapshot in ferry.stream_scan, and moves that snapshot to now. Reads the
-- log like ferry.batch_events: the txid range between the two snapshots'
-- xmax plus the transactions the older one listed as in progress, never from
-- its xmin, so one long transaction cannot make every call slow; the range is
-- bounded on both sides so the txid index stays the plan without statistics
-- (see 0007). Concurrent calls take turns (row lock on ferry.stream_scan).
--
-- Parameters: none.
-- Returns:    the number of streams added.
-- Calls:      nothing.
-- Tables:     reads ferry.events; writes ferry.streams, ferry.stream_scan.
-- Raises:     nothing of its own (42501 without privileges on those tables).
-- Roles:      ferry_relay, through ferry.housekeeping.
---------------------------------------------------------------------------
create function ferry._catalog_streams() returns integer
language plpgsql as $$
declare
    v_from pg_snapshot;
    v_to   pg_snapshot;
    n      integer;
begin
    select s.scanned_to into v_from from ferry.stream_scan s for update;
    v_to := pg_current_snapshot();  -- after the lock: never older than v_from
    insert into ferry.streams as k (stream, first_event_at)
    select x.stream, min(x.created_at)
    from (select e.stream, e.created_at from ferry.events e
          where e.txid >= pg_snapshot_xmax(v_from) and e.txid < pg_snapshot_xmax(v_to)
            and pg_visible_in_snapshot(e.txid, v_to)
          union all
          select e.stream, e.created_at from ferry.events e
          where e.txid = any (array(select pg_snapshot_xip(v_from)))
            and e.txid >= pg_snapshot_xmin(v_from) and e.txid < pg_snapshot_xmax(v_from)
            and pg_visible_in_snapshot(e.txid, v_to)) x
    group by x.stream
    on conflict (stream) do nothing;
    get diagnostics n = row_count;
    update ferry.stream_scan set scanned_to = v_to, scanned_at = now();
    return n;
end $$;

---------------------------------------------------------------------------
-- ferry._unknown_streams(streams text[])
--
-- Which of the given streams nothing has written yet: no current capture
-- writes it, it is not 'net.http' with the pg_net add-on installed, and
-- neither ferry.streams nor the events committed since the catalogued
-- snapshot hold it (see the header of this migration for why this is cheap
-- and sound).
--
-- Parameters: streams  stream names (NULLs and repeats are ignored).
-- Returns:    those unknown, each once, in the order given; '{}' for none.
-- Calls:      nothing.
-- Tables:     reads ferry.streams, ferry.stream_scan, ferry.captures,
--             ferry.addon_migrations, ferry.events.
-- Raises:     nothing of its own (42501 without privileges on those tables).
-- Roles:      ferry_relay (ferry.subscribe, `pgferry status`,
--             `pgferry subscription add`, `pgferry apply`).
---------------------------------------------------------------------------
create function ferry._unknown_streams(streams text[]) returns text[]
language plpgsql stable as $$
declare
    v_scanned pg_snapshot;
    v_pg_net  boolean;
    v_unknown text[];
begin
    select p.scanned_to into v_scanned from ferry.stream_scan p;
    -- PL/pgSQL, not SQL: install creates ferry.addon_migrations after the core migrations.
    v_pg_net := exists (select 1 from ferry.addon_migrations a where a.addon = 'pg_net');
    select coalesce(array_agg(u.stream order by u.ord), '{}') into v_unknown
    from (select s.stream, min(s.ord) as ord
          from unnest(_unknown_streams.streams) with ordinality as s(stream, ord)
          where s.stream is not null group by s.stream) u
    where not exists (select 1 from ferry.streams k where k.stream = u.stream)
      and not exists (select 1 from ferry.captures c where c.stream = u.stream and c.uncaptured_at is null)
      and not (u.stream = 'net.http' and v_pg_net)
      and not exists (select 1 from ferry.events e
                      where e.stream = u.stream
                        and e.txid >= pg_snapshot_xmax(v_scanned)
                        and e.txid < pg_snapshot_xmax(pg_current_snapshot()))
      and not exists (select 1 from ferry.events e
                      where e.stream = u.stream
                        and e.txid = any (array(select pg_snapshot_xip(v_scanned)))
                        and e.txid >= pg_snapshot_xmin(v_scanned) and e.txid < pg_snapshot_xmax(v_scanned));
    return v_unknown;
end $$;

---------------------------------------------------------------------------
-- ferry.housekeeping()  (supersedes 0002_webhooks.sql)
--
-- Everything the elected relay does every few seconds, in one round trip:
-- the stream catalog (first: maintain() may truncate what it has not read
-- yet), rotation and truncation, attempt history, and (with the pg_net API
-- installed) expired net._http_response rows.
--
-- Parameters: none.
-- Returns:    what it did, one line each, for the relay's log (the stream
--             catalog says nothing).
-- Calls:      ferry._catalog_streams, ferry.maintain, ferry.prune_attempts,
--             ferry.prune_net_responses (pg_net add-on).
-- Tables:     those of the functions it calls.
-- Raises:     nothing of its own.
-- Roles:      ferry_relay.
---------------------------------------------------------------------------
create or replace function ferry.housekeeping() returns text[]
language plpgsql as $$
declare
    v_done text[];
    n integer;
begin
    perform ferry._catalog_streams();
    v_done := ferry.maintain();
    n := ferry.prune_attempts();
    if n > 0 then
        v_done := v_done || format('removed %s old delivery attempts', n);
    end if;
    if to_regproc('ferry.prune_net_responses') is not null then
        execute 'select ferry.prune_net_responses()' into n;
        if n > 0 then
            v_done := v_done || format('removed %s expired net._http_response rows', n);
        end if;
    end if;
    return v_done;
end $$;

---------------------------------------------------------------------------
-- ferry.subscribe(name, streams, url, ...)  (supersedes 0004_roles.sql)
--
-- Creates or updates a webhook subscription and its consumer
-- 'webhook:<name>'. Every setting is checked here, before the row exists (a
-- table CHECK would report the whole row, secret included). New in 0008: a
-- NOTICE (SQLSTATE 01PF1, a warning) for each stream nothing has written yet;
-- the subscription is saved all the same and delivers once events arrive.
--
-- Parameters: name                subscription name, 1-100 of [A-Za-z0-9_.:-]
--             streams             streams to deliver (non-empty, no control
--                                 characters, at most 200 characters each)
--             url                 http(s) endpoint (ferry._check_url)
--             batch_size          events per request, 1-1000
--             max_in_flight       requests at once, 1-1000
--             ordered             keep per-key order
--             secret              whsec_ signing secret; NULL keeps the current ones
--             headers             extra request headers (JSON object of strings)
--             timeout_ms, connect_timeout_ms   10 ms - 10 min
--             max_attempts        1-1000
--             max_age             positive interval
--             retry_base_ms, retry_max_ms      >= 0
--             start_at            'now' or 'beginning' (new consumers only)
-- Returns:    nothing.
-- Calls:      ferry._check_url, ferry._check_headers_map, ferry._check_secret,
--             ferry.register_consumer, ferry._unknown_streams.
-- Tables:     writes ferry.subscriptions, ferry.consumers; reads those of
--             ferry._unknown_streams.
-- Raises:     22023 on a bad argument (message says which); NOTICE 01PF1 per
--             unwritten stream.
-- Roles:      ferry_relay (and the installer). ferry_writer may not (42501).
---------------------------------------------------------------------------
create or replace function ferry.subscribe(
    name text,
    streams text[],
    url text,
    batch_size integer default 1,
    max_in_flight integer default 32,
    ordered boolean default false,
    secret text default null,
    headers jsonb default '{}',
    timeout_ms integer default 10000,
    max_attempts integer default 12,
    max_age interval default '3 days',
    retry_base_ms integer default 1000,
    retry_max_ms integer default 600000,
    connect_timeout_ms integer default 5000,
    start_at text default 'now')
returns void language plpgsql as $$
declare
    v_stream text;
begin
    if name is null or name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$' then
        raise exception 'pgferry: subscription name % must be 1-100 letters, digits, _ . : or -', coalesce(quote_literal(name), 'NULL')
            using errcode = '22023';
    end if;
    if streams is null or cardinality(streams) = 0
       or exists (select 1 from unnest(streams) s where s is null or btrim(s) = '') then
        raise exception 'pgferry: streams must list at least one non-empty stream name' using errcode = '22023';
    end if;
    if exists (select 1 from unnest(streams) s where s ~ '[[:cntrl:]]' or length(s) > 200) then
        raise exception 'pgferry: stream names must be at most 200 characters without control characters (line breaks, NUL, ...)'
            using errcode = '22023';
    end if;
    perform ferry._check_url(url);
    perform ferry._check_headers_map(headers);
    if secret is not null then
        perform ferry._check_secret(secret);
    end if;
    if batch_size is null or batch_size not between 1 and 1000 then
        raise exception 'pgferry: batch_size must be between 1 and 1000, got %', batch_size using errcode = '22023';
    end if;
    if max_in_flight is null or max_in_flight not between 1 and 1000 then
        raise exception 'pgferry: max_in_flight must be between 1 and 1000, got %', max_in_flight using errcode = '22023';
    end if;
    if timeout_ms is null or connect_timeout_ms is null
       or timeout_ms not between 10 and 600000 or connect_timeout_ms not between 10 and 600000 then
        raise exception 'pgferry: timeouts must be between 10 ms and 10 minutes' using errcode = '22023';
    end if;
    if max_attempts is null or max_attempts not between 1 and 1000 then
        raise exception 'pgferry: max_attempts must be between 1 and 1000, got %', max_attempts using errcode = '22023';
    end if;
    if max_age is null or max_age <= interval '0' then
        raise exception 'pgferry: max_age must be a positive interval, got %', max_age using errcode = '22023';
    end if;
    if retry_base_ms is null or retry_max_ms is null or retry_base_ms < 0 or retry_max_ms < 0 then
        raise exception 'pgferry: retry_base_ms and retry_max_ms must be 0 or more' using errcode = '22023';
    end if;
    if ordered is null then
        raise exception 'pgferry: ordered must be true or false' using errcode = '22023';
    end if;

    insert into ferry.subscriptions as s (name, streams, url, headers, secrets, batch_size, max_in_flight, ordered,
                                          timeout_ms, connect_timeout_ms, max_attempts, max_age, retry_base_ms, retry_max_ms)
    values (subscribe.name, subscribe.streams, subscribe.url, coalesce(subscribe.headers, '{}'),
            case when subscribe.secret is null then '{}' else array[subscribe.secret] end,
            subscribe.batch_size, subscribe.max_in_flight, subscribe.ordered, subscribe.timeout_ms,
            subscribe.connect_timeout_ms, subscribe.max_attempts, subscribe.max_age,
            subscribe.retry_base_ms, subscribe.retry_max_ms)
    on conflict on constraint subscriptions_pkey do update set
        streams = excluded.streams, url = excluded.url, headers = excluded.headers,
        secrets = case when subscribe.secret is null then s.secrets else excluded.secrets end,
        batch_size = excluded.batch_size, max_in_flight = excluded.max_in_flight, ordered = excluded.ordered,
        timeout_ms = excluded.timeout_ms, connect_timeout_ms = excluded.connect_timeout_ms,
        max_attempts = excluded.max_attempts, max_age = excluded.max_age,
        retry_base_ms = excluded.retry_base_ms, retry_max_ms = excluded.retry_max_ms, updated_at = now();
    perform ferry.register_consumer('webhook:' || subscribe.name, subscribe.streams, start_at);

    -- Saved: now say which streams nothing has written yet (a typo sits idle forever).
    foreach v_stream in array ferry._unknown_streams(subscribe.streams) loop
        raise notice 'pgferry: no events have been written to stream % yet', to_json(v_stream)::text
            using errcode = '01PF1',
                  hint = 'Check the spelling. Streams are written by captured tables (ferry.capture_table; '
                         'named schema.table by default) and by ferry.publish. The subscription is saved and '
                         'will deliver once events arrive.';
    end loop;
end $$;

---------------------------------------------------------------------------
-- Privileges: as 0004 granted them, restated; the new tables and functions
-- for the relay. Writers get nothing here: they cannot read the log, the
-- captures or the subscriptions, so the new functions fail for them (42501).
---------------------------------------------------------------------------

grant execute on function ferry.subscribe(text, text[], text, integer, integer, boolean, text, jsonb, integer,
                                          integer, interval, integer, integer, integer, text) to ferry_relay;
grant execute on function ferry.housekeeping() to ferry_relay;
grant execute on function ferry._catalog_streams() to ferry_relay;
grant execute on function ferry._unknown_streams(text[]) to ferry_relay;
grant select, insert, update, delete, truncate on ferry.streams, ferry.stream_scan to ferry_relay;
