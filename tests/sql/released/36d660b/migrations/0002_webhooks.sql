-- pgferry 0002: webhook subscriptions, parked retries, dead letters, attempt history.
--
-- A subscription reads its streams through its own consumer ('webhook:<name>')
-- and is delivered by exactly one relay at a time (advisory lock). Events that
-- fail are parked in ferry.retries with a copy of the event, so the cursor can
-- move on and retention can drop the log partition; after the attempt/age
-- budget they move to ferry.dead_letters, from where they can be replayed.

alter table ferry.config
    add column attempts_retention interval not null default '3 days',
    add column max_body_bytes integer not null default 1048576 check (max_body_bytes > 0);

create table ferry.subscriptions (
    name                text        primary key
                                    check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    streams             text[]      not null check (cardinality(streams) > 0),
    url                 text        not null,
    headers             jsonb       not null default '{}',
    secrets             text[]      not null default '{}'
                                    check (array_to_string(secrets, ' ') ~ '^(whsec_[A-Za-z0-9+/]+={0,2}( |$))*$'),
    batch_size          integer     not null default 1 check (batch_size between 1 and 1000),
    max_in_flight       integer     not null default 32 check (max_in_flight between 1 and 1000),
    ordered             boolean     not null default false,
    timeout_ms          integer     not null default 10000 check (timeout_ms between 10 and 600000),
    connect_timeout_ms  integer     not null default 5000 check (connect_timeout_ms between 10 and 600000),
    max_attempts        integer     not null default 12 check (max_attempts between 1 and 1000),
    max_age             interval    not null default '3 days',
    retry_base_ms       integer     not null default 1000 check (retry_base_ms >= 0),
    retry_max_ms        integer     not null default 600000 check (retry_max_ms >= 0),
    state               text        not null default 'active' check (state in ('active', 'paused', 'disabled')),
    state_reason        text,
    created_at          timestamptz not null default now(),
    updated_at          timestamptz not null default now()
);

-- Settings changed by a plain UPDATE reach the delivering relay too.
create function ferry._touch_updated_at() returns trigger language plpgsql as $$
begin
    new.updated_at := now();
    return new;
end $$;
create trigger subscriptions_touch before update on ferry.subscriptions
    for each row execute function ferry._touch_updated_at();

comment on column ferry.subscriptions.secrets is
    'Standard Webhooks signing secrets (whsec_<base64>); every one signs each request, so secrets can be rotated.';

create table ferry.retries (
    subscription     text        not null references ferry.subscriptions (name) on delete cascade,
    event_id         bigint      not null,
    stream           text        not null,
    key              text,
    payload          jsonb       not null,
    headers          jsonb,
    event_created_at timestamptz not null,
    attempts         integer     not null,   -- attempts made; 0 = waiting behind an earlier event of its key
    first_failed_at  timestamptz not null default now(),
    next_attempt_at  timestamptz not null,
    last_status      integer,
    last_error       text,
    last_response    text,
    primary key (subscription, event_id)
);
create index retries_due_idx on ferry.retries (subscription, next_attempt_at);
create index retries_key_idx on ferry.retries (subscription, key, event_id);

create table ferry.dead_letters (
    id               bigint      generated always as identity primary key,
    subscription     text        not null references ferry.subscriptions (name) on delete cascade,
    event_id         bigint      not null,
    stream           text        not null,
    key              text,
    payload          jsonb       not null,
    headers          jsonb,
    event_created_at timestamptz not null,
    attempts         integer     not null,
    first_failed_at  timestamptz not null,
    died_at          timestamptz not null default now(),
    last_status      integer,
    last_error       text,
    last_response    text,
    unique (subscription, event_id)
);

create table ferry.attempts (
    id            bigint      generated always as identity primary key,
    subscription  text        not null,
    event_id      bigint      not null,
    attempt       integer     not null,
    status        integer,              -- HTTP status; null when no response came
    error_class   text,                 -- null on success
    error         text,
    response      text,                 -- start of the response body, on failure
    latency_ms    real        not null,
    created_at    timestamptz not null default now()
);
create index attempts_subscription_idx on ferry.attempts (subscription, created_at);
create index attempts_event_idx on ferry.attempts (event_id);

-- Relays announce themselves so they can share subscriptions fairly and so
-- operators can see who delivers what.
create table ferry.relays (
    id            text        primary key,
    hostname      text        not null,
    pid           integer     not null,
    started_at    timestamptz not null default now(),
    heartbeat_at  timestamptz not null default now(),
    owned         text[]      not null default '{}',
    stats         jsonb       not null default '{}'
);

---------------------------------------------------------------------------
-- Validation
---------------------------------------------------------------------------

create function ferry._check_url(url text) returns void
language plpgsql immutable as $$
declare
    v_scheme text;
    v_ip inet;
begin
    if url is null or btrim(url) = '' then
        raise exception 'pgferry: url must not be empty' using errcode = '22023';
    end if;
    v_scheme := lower(substring(url from '^([A-Za-z][A-Za-z0-9+.-]*):'));
    if v_scheme is null then
        raise exception 'pgferry: % is not an absolute URL', quote_literal(url)
            using errcode = '22023', hint = 'Use http://host[:port]/path or https://host[:port]/path.';
    end if;
    if v_scheme not in ('http', 'https') then
        raise exception 'pgferry: unsupported URL scheme %; webhooks are sent over http or https', quote_literal(v_scheme)
            using errcode = '22023';
    end if;
    if url !~ '^[A-Za-z]+://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?([/?#][^\s]*)?$' then
        raise exception 'pgferry: malformed URL %', quote_literal(url)
            using errcode = '22023', hint = 'Expected http(s)://host[:port]/path with no spaces or user:password part.';
    end if;
    -- The relay refuses link-local and cloud-metadata addresses when it
    -- connects (whatever a name resolves to); an IP literal can be refused now.
    begin
        v_ip := coalesce(substring(url from '^[A-Za-z]+://\[([0-9A-Fa-f:.]+)\]'),
                         substring(url from '^[A-Za-z]+://([0-9.]+)(?:[:/?#]|$)'))::inet;
    exception when others then
        v_ip := null;
    end;
    if v_ip is not null and (v_ip << '169.254.0.0/16' or v_ip << 'fe80::/10' or v_ip = 'fd00:ec2::254') then
        raise exception 'pgferry: % is a link-local or cloud-metadata address; webhooks may not be sent there', host(v_ip)
            using errcode = '22023', hint = 'This protects the relay''s network from SSRF.';
    end if;
end $$;

create function ferry._check_headers_map(headers jsonb) returns void
language plpgsql immutable as $$
declare
    v_name text;
    v_value jsonb;
begin
    if headers is null then
        return;
    end if;
    if jsonb_typeof(headers) <> 'object' then
        raise exception 'pgferry: headers must be a JSON object of strings, got a JSON %', jsonb_typeof(headers)
            using errcode = '22023', hint = 'Example: ''{"Authorization": "Bearer abc"}''::jsonb';
    end if;
    for v_name, v_value in select * from jsonb_each(headers) loop
        if v_name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' then
            raise exception 'pgferry: % is not a valid HTTP header name', quote_literal(v_name) using errcode = '22023';
        end if;
        if jsonb_typeof(v_value) <> 'string' then
            raise exception 'pgferry: header % must be a string, got a JSON %', quote_literal(v_name), jsonb_typeof(v_value)
                using errcode = '22023';
        end if;
        if v_value #>> '{}' ~ '[\r\n\x00]' then
            raise exception 'pgferry: header % contains a line break or NUL', quote_literal(v_name) using errcode = '22023';
        end if;
    end loop;
end $$;

create function ferry._check_secret(secret text) returns void
language plpgsql immutable as $$
declare
    v_key bytea;
begin
    if secret is null or secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' then
        raise exception 'pgferry: signing secrets must look like whsec_<base64>'
            using errcode = '22023', hint = 'Generate one with `pgferry subscription secret`.';
    end if;
    begin
        v_key := decode(substr(secret, 7), 'base64');
    exception when others then
        raise exception 'pgferry: signing secret is not valid base64 after whsec_' using errcode = '22023';
    end;
    if length(v_key) < 16 then
        raise exception 'pgferry: signing secret is too short; use at least 16 random bytes' using errcode = '22023';
    end if;
end $$;

---------------------------------------------------------------------------
-- Managing subscriptions
---------------------------------------------------------------------------

create function ferry.subscribe(
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
begin
    if name is null or name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$' then
        raise exception 'pgferry: subscription name % must be 1-100 letters, digits, _ . : or -', coalesce(quote_literal(name), 'NULL')
            using errcode = '22023';
    end if;
    if streams is null or cardinality(streams) = 0
       or exists (select 1 from unnest(streams) s where s is null or btrim(s) = '') then
        raise exception 'pgferry: streams must list at least one non-empty stream name' using errcode = '22023';
    end if;
    perform ferry._check_url(url);
    perform ferry._check_headers_map(headers);
    if secret is not null then
        perform ferry._check_secret(secret);
    end if;
    if batch_size not between 1 and 1000 then
        raise exception 'pgferry: batch_size must be between 1 and 1000, got %', batch_size using errcode = '22023';
    end if;
    if max_in_flight not between 1 and 1000 then
        raise exception 'pgferry: max_in_flight must be between 1 and 1000, got %', max_in_flight using errcode = '22023';
    end if;
    if timeout_ms not between 10 and 600000 or connect_timeout_ms not between 10 and 600000 then
        raise exception 'pgferry: timeouts must be between 10 ms and 10 minutes' using errcode = '22023';
    end if;
    if max_attempts < 1 then
        raise exception 'pgferry: max_attempts must be at least 1, got %', max_attempts using errcode = '22023';
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
end $$;

create function ferry.unsubscribe(name text) returns boolean
language plpgsql as $$
begin
    perform ferry.unregister_consumer('webhook:' || unsubscribe.name);
    delete from ferry.subscriptions s where s.name = unsubscribe.name;
    return found;
end $$;

create function ferry._set_subscription_state(p_name text, p_state text, p_reason text) returns void
language plpgsql as $$
begin
    update ferry.subscriptions set state = p_state, state_reason = p_reason, updated_at = now() where name = p_name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(p_name) using errcode = '42704';
    end if;
end $$;

create function ferry.pause_subscription(name text) returns void
language sql as $$ select ferry._set_subscription_state(name, 'paused', 'paused by an operator') $$;

create function ferry.resume_subscription(name text) returns void
language sql as $$ select ferry._set_subscription_state(name, 'active', null) $$;

-- Rotation: sign with several secrets at once, then drop the old one.
create function ferry.set_subscription_secrets(name text, secrets text[]) returns void
language plpgsql as $$
declare
    v_secret text;
begin
    foreach v_secret in array coalesce(secrets, '{}') loop
        perform ferry._check_secret(v_secret);
    end loop;
    update ferry.subscriptions s set secrets = coalesce(set_subscription_secrets.secrets, '{}'), updated_at = now()
    where s.name = set_subscription_secrets.name;
    if not found then
        raise exception 'pgferry: subscription % does not exist', quote_literal(name) using errcode = '42704';
    end if;
end $$;

---------------------------------------------------------------------------
-- Dead letters
---------------------------------------------------------------------------

-- Put dead letters back in line for delivery (fresh attempt budget). With no
-- ids, every dead letter of the subscription. Returns how many.
create function ferry.dlq_replay(subscription text, ids bigint[] default null) returns integer
language plpgsql as $$
declare
    n integer;
begin
    with moved as (
        delete from ferry.dead_letters d
        where d.subscription = dlq_replay.subscription and (ids is null or d.id = any (ids))
          -- an event already parked again (e.g. replayed twice) keeps its dead letter
          and not exists (select 1 from ferry.retries r where r.subscription = d.subscription and r.event_id = d.event_id)
        returning d.*
    )
    insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                               attempts, first_failed_at, next_attempt_at, last_status, last_error, last_response)
    select m.subscription, m.event_id, m.stream, m.key, m.payload, m.headers, m.event_created_at,
           0, now(), now(), m.last_status, m.last_error, m.last_response
    from moved m
    on conflict do nothing;
    get diagnostics n = row_count;
    return n;
end $$;

create function ferry.dlq_discard(subscription text, ids bigint[] default null) returns integer
language plpgsql as $$
declare
    n integer;
begin
    delete from ferry.dead_letters d
    where d.subscription = dlq_discard.subscription and (ids is null or d.id = any (ids));
    get diagnostics n = row_count;
    return n;
end $$;

---------------------------------------------------------------------------
-- Status
---------------------------------------------------------------------------

-- Rates come from the owning relay's heartbeat (rolling in-memory counters),
-- so status stays cheap however many attempts are stored.
create function ferry.subscription_status()
returns table (name text, state text, state_reason text, url text, streams text[],
               lag_events bigint, lag_seconds double precision, parked bigint, dead bigint,
               delivered_1m bigint, failed_5m bigint, attempts_5m bigint, owner text, in_flight integer)
language sql stable as $$
    select s.name, s.state, s.state_reason,
           regexp_replace(s.url, '\?.*$', '?…'),
           s.streams,
           greatest(0, (select max(t.event_seq) from ferry.ticks t) - t0.event_seq),
           coalesce(extract(epoch from now() - (select min(t.created_at) from ferry.ticks t where t.id > c.tick_id)), 0),
           (select count(*) from ferry.retries r where r.subscription = s.name),
           (select count(*) from ferry.dead_letters d where d.subscription = s.name),
           (r.stats -> 'delivered_1m' ->> s.name)::bigint,
           (r.stats -> 'failed_5m' ->> s.name)::bigint,
           (r.stats -> 'attempts_5m' ->> s.name)::bigint,
           r.id,
           (r.stats -> 'in_flight' ->> s.name)::int
    from ferry.subscriptions s
    left join ferry.consumers c on c.name = 'webhook:' || s.name
    left join ferry.ticks t0 on t0.id = c.tick_id
    left join lateral (
        select rl.id, rl.stats from ferry.relays rl
        where s.name = any (rl.owned) and rl.heartbeat_at > now() - interval '15 seconds'
        order by rl.heartbeat_at desc limit 1) r on true
    order by s.name
$$;

---------------------------------------------------------------------------
-- Retention of the attempt history (bounded, in chunks), relay heartbeats
---------------------------------------------------------------------------

create function ferry.prune_attempts(max_rows integer default 10000) returns integer
language plpgsql as $$
declare
    n integer;
begin
    delete from ferry.attempts where id in (
        select id from ferry.attempts
        where created_at < now() - (select attempts_retention from ferry.config)
        order by id limit max_rows);
    get diagnostics n = row_count;
    delete from ferry.relays where heartbeat_at < now() - interval '1 hour';
    return n;
end $$;

-- One relay round trip: heartbeat, then the active subscriptions with the
-- number of live relays (to compute a fair share). A relay is live while its
-- ownership connection holds the shared "presence" advisory lock (classid
-- 0x7066, objid 3), so a killed relay stops counting the moment its
-- connection ends, however rarely relays heartbeat.
create function ferry.relay_round(relay_id text, hostname text, pid integer, owned text[], stats jsonb)
returns table (live_relays bigint, subscription ferry.subscriptions)
language plpgsql as $$
begin
    insert into ferry.relays as r (id, hostname, pid, owned, stats)
    values (relay_round.relay_id, relay_round.hostname, relay_round.pid, relay_round.owned, relay_round.stats)
    on conflict (id) do update set heartbeat_at = now(), owned = excluded.owned, stats = excluded.stats;
    return query
        select (select count(*) from pg_locks l
                where l.locktype = 'advisory' and l.classid = 28774 and l.objid = 3 and l.objsubid = 2
                  and l.granted and l.database = (select oid from pg_database where datname = current_database())),
               s
        from ferry.subscriptions s where s.state = 'active' order by s.name;
end $$;

-- Everything the elected relay does every few seconds, in one round trip:
-- rotation and truncation, attempt history, and (with the pg_net API
-- installed) expired net._http_response rows. Returns what it did.
create function ferry.housekeeping() returns text[]
language plpgsql as $$
declare
    v_done text[] := ferry.maintain();
    n integer;
begin
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

-- The common end of a webhook batch, every event delivered, in one statement:
-- the attempts and the cursor move commit together, without a transaction
-- block of several round trips.
create function ferry.record_delivered_batch(
    subscription text, consumer text, batch bigint, event_ids bigint[], attempt_nos integer[],
    statuses integer[], latencies real[])
returns void language plpgsql as $$
begin
    insert into ferry.attempts (subscription, event_id, attempt, status, latency_ms)
    select record_delivered_batch.subscription, u.e, u.a, u.s, u.l
    from unnest(event_ids, attempt_nos, statuses, latencies) as u(e, a, s, l);
    perform ferry.finish_batch(consumer, batch);
end $$;

-- A webhook worker's next batch and its events in one round trip. A batch
-- with no events for the subscription comes back as one row with a null id,
-- so that it can still be acknowledged.
create function ferry.next_webhook_batch(consumer text, max_events integer default null)
returns table (batch_id bigint, id bigint, stream text, key text, payload text, headers text, created_at timestamptz)
language plpgsql as $$
declare
    b record;
begin
    select * into b from ferry.next_batch(consumer, max_events);
    if b.batch_id is null then
        return;
    end if;
    return query
        select b.batch_id, e.id, e.stream, e.key, e.payload::text, e.headers::text, e.created_at
        from ferry.batch_events(b.start_tick, b.end_tick, b.streams) e;
    if not found then
        return query select b.batch_id, null::bigint, null::text, null::text, null::text, null::text, null::timestamptz;
    end if;
end $$;
