-- ferry.subscribe( name text, streams text[], url text, batch_size integer default 1, max_in_flight integer default 32, ordered boolean default false, secret text default null, headers jsonb default '{}', timeout_ms integer default 10000, max_attempts integer default 12, max_age interval default '3 days', retry_base_ms integer default 1000, retry_max_ms integer default 600000, connect_timeout_ms integer default 5000, start_at text default 'now', filter text default null, partitions integer default 1) returns void
--
-- Creates or updates a webhook subscription and its consumers
-- ('webhook:<name>', one per partition since 0018). Every setting is checked here, before the row exists (a
-- table CHECK would report the whole row, secret included). New in 0008: a
-- NOTICE (SQLSTATE 01PF1, a warning) for each stream nothing has written yet;
-- the subscription is saved all the same and delivers once events arrive.
-- New in 0012: filter, a jsonpath predicate over the event; only events for
-- which it is true are delivered (ferry._filter_match says what it sees).
-- Like every other setting it is declared whole on each call: subscribing
-- again without one removes the filter. A change applies to the batches
-- the relay reads from then on; events the cursor passed stay passed.
--
-- Parameters: name                subscription name, 1-100 of [A-Za-z0-9_.:-]
--             streams             streams to deliver (non-empty, no control
--                                 characters, at most 200 characters each;
--                                 one listed twice is kept once)
--             url                 http(s) endpoint (ferry._check_url)
--             batch_size          events per request, 1-1000
--             max_in_flight       requests at once, 1-1000
--             ordered             keep per-key order
--             secret              whsec_ signing secret; NULL keeps the current ones
--             headers             extra request headers (JSON object of strings)
--             timeout_ms, connect_timeout_ms   10 ms - 10 min
--             max_attempts        1-1000
--             max_age             positive interval
--             retry_base_ms, retry_max_ms      >= 0, base <= max
--             start_at            'now' or 'beginning' (new consumers only)
--             filter              jsonpath predicate, e.g. '$.record.amount > 100'
--                                 (ferry._check_filter); NULL delivers every event
--             partitions          1-256 (migration 0018): events spread over this
--                                 many partitions by key hash, each with its own
--                                 consumer and worker (ferry._subscription_consumers
--                                 says how a change on a live subscription drains)
-- Returns:    nothing.
-- Calls:      ferry._check_url, ferry._check_headers_map, ferry._check_secret,
--             ferry._check_filter, ferry._subscription_consumers, ferry._unknown_streams.
-- Tables:     writes ferry.subscriptions, ferry.consumers; reads those of
--             ferry._unknown_streams. NOTIFY pgferry_changed (its name): the
--             relays start their next ownership round now, so a changed URL,
--             filter or setting applies within milliseconds, not at the next
--             round up to 2 s later (a Redis subscription moved to another
--             stream and replayed at once sent the replay to the old stream,
--             whose duplicate marks dropped it, recorded delivered: outside
--             probe).
-- Raises:     22023 on a bad argument (message says which, for a filter also
--             why: not a jsonpath, not a predicate, an unknown variable); NOTICE 01PF1 per
--             unwritten stream; 55000 when a change of partitions is still draining.
-- Roles:      ferry_relay (and the installer). ferry_writer may not (42501).

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
    start_at text default 'now',
    filter text default null,
    partitions integer default 1)
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
    -- A stream listed twice is one stream: kept twice, the batch read matched each of its events
    -- to the subscription once per listing, and each was delivered twice (outside probe).
    subscribe.streams := array(select u.s from unnest(subscribe.streams) with ordinality u(s, n)
                               group by u.s order by min(u.n));
    perform ferry._check_url(url);
    perform ferry._check_headers_map(headers, strict => true);
    perform ferry._check_filter(subscribe.filter);
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
    if retry_base_ms > retry_max_ms then  -- every wait would be retry_max_ms: surely a mistake (outside probe)
        raise exception 'pgferry: retry_base_ms (%) is larger than retry_max_ms (%)', retry_base_ms, retry_max_ms
            using errcode = '22023', hint = 'The first retry waits about retry_base_ms, each next one twice as long, '
                                            'up to retry_max_ms.';
    end if;
    if subscribe.partitions is null or subscribe.partitions not between 1 and 256 then
        raise exception 'pgferry: partitions must be between 1 and 256, got %', coalesce(subscribe.partitions::text, 'NULL')
            using errcode = '22023', hint = 'One partition per core the relays have is a good start.';
    end if;
    if ordered is null then
        raise exception 'pgferry: ordered must be true or false' using errcode = '22023';
    end if;

    insert into ferry.subscriptions as s (name, streams, url, headers, secrets, batch_size, max_in_flight, ordered,
                                          timeout_ms, connect_timeout_ms, max_attempts, max_age, retry_base_ms, retry_max_ms,
                                          filter, partitions)
    values (subscribe.name, subscribe.streams, subscribe.url, coalesce(subscribe.headers, '{}'),
            case when subscribe.secret is null then '{}' else array[subscribe.secret] end,
            subscribe.batch_size, subscribe.max_in_flight, subscribe.ordered, subscribe.timeout_ms,
            subscribe.connect_timeout_ms, subscribe.max_attempts, subscribe.max_age,
            subscribe.retry_base_ms, subscribe.retry_max_ms, subscribe.filter, subscribe.partitions)
    on conflict on constraint subscriptions_pkey do update set
        streams = excluded.streams, url = excluded.url, headers = excluded.headers,
        secrets = case when subscribe.secret is null then s.secrets else excluded.secrets end,
        batch_size = excluded.batch_size, max_in_flight = excluded.max_in_flight, ordered = excluded.ordered,
        timeout_ms = excluded.timeout_ms, connect_timeout_ms = excluded.connect_timeout_ms,
        max_attempts = excluded.max_attempts, max_age = excluded.max_age,
        retry_base_ms = excluded.retry_base_ms, retry_max_ms = excluded.retry_max_ms, filter = excluded.filter,
        partitions = excluded.partitions,
        updated_at = now();
    perform ferry._subscription_consumers(subscribe.name, subscribe.streams, start_at, subscribe.partitions);
    perform pg_notify('pgferry_changed', subscribe.name);

    -- Saved: now say which streams nothing has written yet (a typo sits idle forever).
    foreach v_stream in array ferry._unknown_streams(subscribe.streams) loop
        raise notice 'pgferry: no events have been written to stream % yet', to_json(v_stream)::text
            using errcode = '01PF1',
                  hint = 'Check the spelling. Streams are written by captured tables (ferry.capture_table; '
                         'named schema.table by default) and by ferry.publish. The subscription is saved and '
                         'will deliver once events arrive.';
    end loop;
end $$;

grant execute on function ferry.subscribe(text, text[], text, integer, integer, boolean, text, jsonb, integer,
                                          integer, interval, integer, integer, integer, text, text, integer)
    to ferry_relay;
