-- pgferry 0013: backfills. The rows a captured table already holds become
-- events of type READ, written into the same log as live changes, in short
-- chunk transactions, optionally for one consumer only.
--
-- Why not a script that SELECTs the table and publishes: it races with live
-- writes. A row read at 10:00:00.000 and published at 10:00:00.050 may have
-- been updated at 10:00:00.020; the subscriber then receives the UPDATE and,
-- after it, the stale READ, and keeps the stale row for good.
--
-- How a chunk is ordered against live changes (ferry.backfill_chunk). One
-- transaction per chunk, READ COMMITTED:
--   1. pick the chunk's upper key: the chunk_size-th key after last_key in
--      primary-key order (a plain read, no lock);
--   2. INSERT INTO ferry.events ... SELECT the rows with key in
--      (last_key, upper] FOR SHARE: every row is locked as it is read and
--      its READ event built from the locked, newest committed version;
--   3. store upper as last_key, commit.
-- Events are delivered in the order of the first tick whose snapshot sees
-- their transaction committed, then by id. Take any change W of a row r
-- that the chunk T reads:
--   * W committed before T locked r. T's READ shows W's version (a FOR
--     SHARE read in READ COMMITTED waits for an in-progress writer and then
--     reads the newest version). W committed before T commits, so a tick
--     that sees T committed sees W committed: W's batch is not later than
--     T's; in one batch, W's event id was drawn before W committed, so
--     before T's ids: W's event is delivered first, then the READ.
--   * W changes r after T locked it. W waits for T's share lock, so W's
--     trigger draws its event id after T committed, and any tick that sees
--     W committed sees T committed: the READ is delivered first, then W.
--   * W inserts a row into (last_key, upper] that T does not see: T emits
--     no READ for it; the INSERT event is the row's last event. A later
--     chunk starts after upper, so it never reads it either.
-- So for every key the last event delivered shows the newest committed row,
-- and no READ of an old version follows the change that replaced it. The
-- argument needs the share lock: without it, a writer committing between
-- T's read and T's commit lands before T's READ of the old version
-- (tests/capture/test_backfill_consistency.py catches that at once). The
-- lock is held for one chunk (2,000 rows by default, a few hundredths of a second)
-- and only blocks writers of those rows; inserts and other rows never wait.
-- A chunk is picked in a separate statement so that a row whose key an
-- update moved out of (last_key, upper] cannot push last_key past rows not
-- yet read (a READ's own key may move, upper never does).
--
-- This is DBLog's requirement (no READ may overtake a newer change) met in
-- a simpler way than its watermarks: DBLog and Debezium's incremental
-- snapshots read from the database and append to a separate log, so they
-- must find out afterwards which chunk rows changed between two watermarks
-- and drop those. Here the chunk's read and its append are one transaction
-- in the log's own database, and the share lock makes commit order agree
-- with what the read saw.
--
-- Targeting. A backfill for one subscription or consumer marks its events
-- with events.target (the consumer's name); ferry.batch_events takes the
-- reader's name and leaves out events targeted at anyone else, so the other
-- cursors move over them like over any event of another stream, and
-- `pgferry trace` says "not for this subscription". NULL: for everyone.
-- The column is NULL for every live event, so adding it rewrites nothing.
--
-- Progress lives in ferry.backfills, written in each chunk's transaction,
-- so a runner killed at any moment resumes exactly after the last chunk
-- that committed: no row missing, no READ written twice. Runners serialize
-- on the backfill's row (FOR UPDATE SKIP LOCKED), so two runners of one
-- backfill alternate chunks rather than repeat them.
--
-- ferry.batch_events gains its reader parameter (functions/ferry.batch_events.sql):
-- the three-argument form is dropped here; old callers keep working, since
-- the new parameter defaults to NULL (only events for everyone).

alter table ferry.events add column target text;

comment on column ferry.events.target is
    'pgferry: the consumer a backfill event is meant for (NULL: for every reader of the stream).';

create table ferry.backfills (
    id             bigint      generated always as identity primary key,
    capture        integer     not null,
    relid          oid         not null,
    schema_name    text        not null,
    table_name     text        not null,
    -- the consumer the READ events are for; NULL: every reader of the stream
    target         text,
    condition      text,
    chunk_size     integer     not null check (chunk_size > 0),
    -- the primary key of the last row done, as a JSON object {column: value}; NULL: none yet
    last_key       jsonb,
    rows_done      bigint      not null default 0,
    chunks_done    bigint      not null default 0,
    -- pg_class.reltuples when the backfill started (NULL: never analysed)
    rows_estimate  bigint,
    state          text        not null default 'running'
                   check (state in ('running', 'paused', 'cancelled', 'done', 'failed')),
    reason         text,
    created_by     text        not null default current_user,
    started_at     timestamptz not null default now(),
    updated_at     timestamptz not null default now(),
    finished_at    timestamptz
);

create index backfills_active_idx on ferry.backfills (id) where state in ('running', 'paused');

comment on table ferry.backfills is
    'pgferry: backfills of captured tables (ferry.backfill), their progress and state.';

drop function if exists ferry.batch_events(bigint, bigint, text[]);

-- ferry.lookup_event also returns the target (functions/ferry.lookup_event.sql).
drop function if exists ferry.lookup_event(bigint);
