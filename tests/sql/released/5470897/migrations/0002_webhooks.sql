-- pgferry 0002: webhook subscriptions, parked retries, dead letters, attempt history.
--
-- A subscription reads its streams through its own consumer ('webhook:<name>')
-- and is delivered by exactly one relay at a time (advisory lock). Events that
-- fail are parked in ferry.retries with a copy of the event, so the cursor can
-- move on and retention can drop the log partition; after the attempt/age
-- budget they move to ferry.dead_letters, from where they can be replayed.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

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
