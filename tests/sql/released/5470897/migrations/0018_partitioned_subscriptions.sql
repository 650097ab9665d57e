-- pgferry 0018: partitioned subscriptions. One subscription was one consumer,
-- read and sent by one worker in one relay process: a hot subscription could
-- not use a second core or a second relay. ferry.subscribe(..., partitions =>
-- N) spreads a subscription's events over N partitions by key hash (events
-- without a key by id; ferry._partition_of), each with its own consumer,
-- cursor and worker, claimed by any relay like a subscription (the consumer
-- is the unit of ownership). A key always lands in the same partition, so
-- per-key order holds.
--
-- Consumers: 'webhook:<name>' when partitions = 1 (as before), else
-- 'webhook:<name>#<p>/<N>' (ferry._partition_consumer). Each consumer row
-- says which subscription it delivers, and which partition of how many.
--
-- Changing N on a live subscription (ferry.subscribe again with another N):
-- the current partitions drain up to the newest tick T (drain_to = T: they
-- read nothing after it), the new ones start at T and read nothing until
-- every draining partition has reached T; then the drained ones are removed
-- (ferry.relay_round). Every key's events before T are delivered by its old
-- partition before any of its events after T by its new one.

alter table ferry.subscriptions add column partitions integer not null default 1;
alter table ferry.subscriptions add constraint subscriptions_partitions_check check (partitions between 1 and 256);

alter table ferry.consumers
    add column subscription text,
    add column part integer not null default 0,
    add column parts integer not null default 1,
    add column drain_to bigint;
update ferry.consumers c set subscription = s.name from ferry.subscriptions s where c.name = 'webhook:' || s.name;
alter table ferry.consumers
    add constraint consumers_subscription_fkey foreign key (subscription)
        references ferry.subscriptions (name) on delete cascade,
    add constraint consumers_part_check check (parts between 1 and 256 and part >= 0 and part < parts);
create index consumers_subscription on ferry.consumers (subscription) where subscription is not null;

-- New result columns (the unit a relay claims is a consumer) and a new parameter.
drop function if exists ferry.relay_round(text, text, integer, text[], jsonb);
drop function if exists ferry.subscription_status();
drop function if exists ferry.subscribe(text, text[], text, integer, integer, boolean, text, jsonb, integer, integer,
                                        interval, integer, integer, integer, text, text);
