-- pgferry 0010: streams can be closed; readers follow a stream by name from
-- any offset without registering anything.
--
-- A stream is any name events are published to. Until now a stream had no
-- end: a reader of an LLM answer streamed token by token, of a job's
-- progress, could not tell "finished" from "slow". ferry.close_stream(name)
-- ends one, in the writer's transaction: it appends an end marker, an event
-- of the stream whose headers say {"pgferry-control": "end"}, so readers meet
-- the end in commit order, exactly after the last event, and records the
-- stream here, so that later publishes to it fail with a clear error
-- (ferry.publish and ferry.publish_many look it up: one primary-key probe
-- of this small table per call; measured in docs/benchmarks.md).
--
-- A publish racing with the close (begun before it committed, under a
-- snapshot that does not see it, or in REPEATABLE READ) can still commit
-- after the end marker; readers stop at the end marker, so such an event is
-- never read. Closing is meant for the stream's own producer, after its last
-- publish, in the same or a later transaction.
--
-- The functions (ferry.close_stream, and the checks in ferry.publish and
-- ferry.publish_many) live in functions/.

create table ferry.closed_streams (
    stream     text        primary key,
    end_event  bigint      not null,
    -- the closing transaction: once the oldest retained tick sees it committed, retention has
    -- dropped the whole stream, end marker included, and a reader from its start ends at once
    end_txid   xid8        not null,
    closed_at  timestamptz not null default now()
);

comment on table ferry.closed_streams is
    'pgferry: streams ended by ferry.close_stream, and the id of each one''s end marker event.';

-- Where a reader "from the beginning" of a stream begins. The log has no
-- index on stream (it would cost every writer: docs/benchmarks.md,
-- "Streams"), so history is read in ranges of ticks, filtered by stream.
-- Started at the oldest retained tick, a reader of a one-minute-old chat
-- answer would read the whole retained log first. Instead the stream
-- catalog (0008) now records, off the writer's path, the tick after which
-- each stream's first event committed: housekeeping catalogues the events
-- of the ticks (scanned_tick, newest] (ferry._catalog_streams), so a
-- stream it finds for the first time has first_tick = the previous
-- scanned_tick. A stream not in the catalog yet was first written after
-- scanned_tick: its readers begin there, a few seconds back.
alter table ferry.streams add column first_tick bigint;
alter table ferry.stream_scan add column scanned_tick bigint;

comment on column ferry.streams.first_tick is
    'pgferry: every event of the stream committed after this tick (NULL: catalogued before 0010, unknown).';
comment on column ferry.stream_scan.scanned_tick is
    'pgferry: the tick whose snapshot scanned_to is (NULL before the first scan since 0010).';
