-- pgferry 0029: delivered events recorded one row per acknowledgement, not one per event.
--
-- Every delivered event was one row of ferry.attempts with three indexes:
-- at batch 100 that was 100 rows per request, ~3 us of database CPU per
-- event (0.8 without the indexes), the largest share of the database's
-- work per delivered event after the read, and the largest table pgferry
-- keeps (a row per event per subscription for attempts_retention). The
-- acknowledgements ferry.webhook_steps records (every event of the request
-- delivered, with its attempt number, status and latency) now go here, one
-- row per acknowledgement, attempt number and status (one per step of a
-- subscription, as a rule): the ids it delivered, their latencies, and
-- their range for pgferry trace's lookup (a GiST index on the range; the
-- ids are then checked in the array). ferry.attempts keeps every failed
-- attempt and the successes recorded beside failures, as before.
-- ferry.attempt_history() reads both as one row per event and attempt.
--
-- Ids come from the attempts' sequence, so that the two tables' rows share
-- one order (which attempt of an event came last).

create table ferry.deliveries (
    id            bigint      not null default nextval('ferry.attempts_id_seq') primary key,
    subscription  text        not null,
    events        int8range   not null,   -- [lowest, highest] of event_ids
    event_ids     bigint[]    not null,   -- ascending
    latencies_ms  real[]      not null,   -- of each event's request, in the order of event_ids
    attempt       integer     not null,
    status        integer,                -- HTTP status; null where the sink has none (brokers)
    created_at    timestamptz not null default now()
);

create index deliveries_subscription_idx on ferry.deliveries (subscription, created_at);

create index deliveries_events_idx on ferry.deliveries using gist (events);

comment on table ferry.deliveries is
    'pgferry: successful attempts, one row per acknowledgement, attempt number and status; failures are in '
    'ferry.attempts; ferry.attempt_history() reads both, one row per event.';

-- As 0004 granted them, restated for the new table (default privileges cover
-- it only when the installing role is the one that ran 0004).
grant select, insert, update, delete on ferry.deliveries to ferry_relay;
