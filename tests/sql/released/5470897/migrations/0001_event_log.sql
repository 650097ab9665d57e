-- pgferry 0001: the durable, commit-ordered event log.
--
-- Writers append to ferry.events inside their own transaction (ferry.publish,
-- capture triggers). The relay's ticker records snapshots in ferry.ticks; a
-- batch for a consumer is "every event whose transaction committed between two
-- ticks", which is exact no matter in which order transactions got their ids
-- or committed (the Skytools PgQ technique, in plain SQL on xid8/pg_snapshot).
--
-- Nothing here sends NOTIFY from a writer path: only ferry.tick(), called by
-- the single elected ticker, notifies, once per tick.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

create schema if not exists ferry;

-- Event ids are handed out in call order (no sequence cache) so that two
-- writes to one key, serialized by a row lock, get increasing ids.
create sequence ferry.event_id_seq as bigint no cycle;

create sequence ferry.tick_id_seq as bigint no cycle;

create sequence ferry.batch_id_seq as bigint no cycle;

-- Which events partition writers append to. A sequence, not a table row, on
-- purpose: setval() is seen at once by every transaction whatever its
-- snapshot (even REPEATABLE READ ones), which is what makes rotation safe.
create sequence ferry.current_partition_seq as smallint minvalue 0 maxvalue 2 start 0 no cycle;

create table ferry.events (
    id          bigint      not null default nextval('ferry.event_id_seq'),
    part        smallint    not null,
    txid        xid8        not null default pg_current_xact_id(),
    stream      text        not null,
    key         text,
    payload     jsonb       not null,
    headers     jsonb,
    created_at  timestamptz not null default now()
) partition by list (part);

create table ferry.events_0 partition of ferry.events for values in (0);

create table ferry.events_1 partition of ferry.events for values in (1);

create table ferry.events_2 partition of ferry.events for values in (2);

create index events_txid_idx on ferry.events (txid);

comment on table ferry.events is
    'pgferry event log. Append-only; whole partitions are truncated once every consumer has passed them.';

-- Rotation state of the three partitions.
--   open_tick:   newest tick taken before the partition became current; reading
--                from it returns every event stored in the partition.
--   closed_xmax: the txid of a transaction started after writers stopped
--                choosing the partition. Every writer into it took its txid
--                before reading the pointer, so it has a smaller txid; once
--                every consumer's tick has xmin >= closed_xmax, the partition
--                holds nothing unread and may be truncated.
create table ferry.partitions (
    part         smallint    primary key check (part between 0 and 2),
    state        text        not null check (state in ('current', 'closing', 'closed', 'empty')),
    opened_at    timestamptz,
    open_tick    bigint,
    closed_at    timestamptz,
    closed_xmax  xid8
);

create table ferry.ticks (
    id          bigint       primary key,
    snapshot    pg_snapshot  not null,
    -- last event id handed out before the snapshot: bounds batch sizes cheaply
    event_seq   bigint       not null,
    created_at  timestamptz  not null default now()
);

create table ferry.consumers (
    name          text        primary key check (name <> '' and length(name) <= 200),
    streams       text[],                 -- null: every stream
    tick_id       bigint      not null,   -- cursor: everything visible at this tick is done
    next_tick_id  bigint,                 -- end of the batch handed out and not yet acked
    batch_id      bigint,
    created_at    timestamptz not null default now(),
    updated_at    timestamptz not null default now()
);

create table ferry.config (
    singleton          boolean  primary key default true check (singleton),
    rotation_interval  interval not null default '5 minutes',
    -- tick at least this often even with nothing new, so cursors (and with
    -- them retention) move past transactions that were in flight at the last tick
    idle_tick_interval interval not null default '10 seconds',
    max_batch_events   integer  not null default 5000 check (max_batch_events > 0)
);

insert into ferry.config default values;

insert into ferry.ticks (id, snapshot, event_seq)
values (nextval('ferry.tick_id_seq'), pg_current_snapshot(), 0);

insert into ferry.partitions (part, state, opened_at, open_tick)
values (0, 'current', now(), 1), (1, 'empty', null, null), (2, 'empty', null, null);
