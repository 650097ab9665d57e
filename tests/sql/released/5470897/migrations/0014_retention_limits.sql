-- pgferry 0014: bounded retention. A consumer nobody reads (a paused
-- subscription, a dead stream reader, a consumer nobody removed) used to pin
-- the log forever: ferry.maintain keeps a closed partition until every
-- cursor passed it, and rotation waits for the next partition to be empty,
-- so the current partition grew until the disk was full (the "insatiable
-- replication slot" of WAL-based tools).
--
-- The limit. ferry.config.max_retention (time, 7 days) and
-- max_retention_bytes (the size of the log's partitions, NULL: no size cap).
-- A consumer whose cursor is older than max_retention (the oldest tick it has
-- not passed), or that holds back a closed partition while the log is over
-- max_retention_bytes, is marked stalled (consumers.stalled_at, _reason):
-- from then on it no longer holds truncation back. Nothing is skipped yet:
-- a stalled consumer that catches up before its partition goes is simply
-- unmarked. A consumer within the limit is never stalled.
--
-- The gap. When maintain truncates a partition a stalled consumer had not
-- passed, in the same transaction and before the TRUNCATE it counts the
-- events of the consumer's streams in that partition the consumer had not
-- read (not visible in its cursor's snapshot; backfills for others left out),
-- records them in ferry.gaps (tick range, count, event ids and times), and
-- moves the cursor to the oldest tick still retained (the opening tick of the
-- oldest partition left): reading on from there returns every event still in
-- the log and nothing twice. Successive truncations under a consumer that
-- still has not read anything extend its open gap instead of adding rows. A
-- subscription whose consumer got a gap is set to state 'stalled' (relays
-- stop delivering it) until an operator resumes it, from what is retained
-- or from now; a plain consumer's next_batch raises PF002 naming the gap
-- until ferry.resume_consumer. Either way the loss is never silent.
--
-- consumers.retention_level remembers the last warning level said (0, 50,
-- 80 percent of the limit), so the elected relay logs a crossing once, not
-- every maintenance round.
--
-- ferry.resume_subscription gains from_position (functions/ferry.resume_subscription.sql):
-- the one-argument form is dropped here; callers that pass one argument keep
-- working, the new parameter defaults to NULL.

alter table ferry.config
    add column max_retention interval not null default '7 days'
        constraint max_retention_positive check (max_retention > interval '0'),
    add column max_retention_bytes bigint
        constraint max_retention_bytes_positive check (max_retention_bytes is null or max_retention_bytes > 0);

alter table ferry.consumers
    add column stalled_at      timestamptz,
    add column stalled_reason  text,
    add column retention_level smallint not null default 0;

alter table ferry.subscriptions drop constraint subscriptions_state_check;
alter table ferry.subscriptions add constraint subscriptions_state_check
    check (state in ('active', 'paused', 'disabled', 'stalled'));

create table ferry.gaps (
    id               bigint      generated always as identity primary key,
    consumer         text        not null references ferry.consumers (name) on delete cascade,
    -- the subscription the consumer belongs to (webhook:NAME), NULL for a plain consumer
    subscription     text,
    -- the cursor before and after: the events skipped were committed in between
    from_tick        bigint      not null,
    to_tick          bigint      not null,
    -- events of the consumer's streams it had not read when retention dropped them
    events           bigint      not null,
    first_event_id   bigint,
    last_event_id    bigint,
    oldest_event_at  timestamptz,
    newest_event_at  timestamptz,
    -- 'retention' (the limit) or 'resumed from now' (an operator skipped retained events)
    cause            text        not null,
    reason           text,
    recorded_at      timestamptz not null default now(),
    updated_at       timestamptz not null default now()
);

create index gaps_consumer_idx on ferry.gaps (consumer, id);

comment on table ferry.gaps is
    'pgferry: events a stalled consumer never got (dropped by the retention limit, or skipped by a resume from now).';

drop function if exists ferry.resume_subscription(text);

-- As 0004 granted them, restated for the new table (default privileges cover
-- it only when the installing role is the one that ran 0004).
grant select, insert, update, delete on ferry.gaps to ferry_relay;
