-- pgferry 0003: compact capture rows; the envelope is built when a batch is read.
--
-- A captured row used to be stored as its whole Supabase envelope
-- ({type, schema, table, record, old_record}). Measured on the writer's hot
-- path (see docs/benchmarks.md), building and storing that envelope was the
-- largest avoidable cost of a single-row insert. Capture triggers now store
-- the record as it is, plus which capture wrote it and the kind of change;
-- ferry.batch_events puts the same envelope back together for every reader,
-- so consumers see no difference.
--
-- Rows written by capture functions generated before this migration carry
-- op = NULL and their full envelope, and are read as they are: nothing needs
-- rewriting. Run ferry.capture_table again on such a table to switch it to
-- the compact form.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

-- Every capture_table call is recorded, and the row is never deleted while
-- events may still point at it: the schema and table name of an event come
-- from here, as they were when the capture was set up.
create table ferry.captures (
    id             integer     generated always as identity primary key,
    relid          oid         not null,
    schema_name    text        not null,
    table_name     text        not null,
    stream         text        not null,
    key_columns    text[]      not null,
    operations     text[]      not null,
    created_at     timestamptz not null default now(),
    uncaptured_at  timestamptz
);

create index captures_relid_idx on ferry.captures (relid) where uncaptured_at is null;

comment on table ferry.captures is
    'pgferry: tables captured with ferry.capture_table, current and past (uncaptured_at set).';

-- capture:     ferry.captures.id of the capture that wrote the row, NULL for published events.
-- op:          'I', 'U' or 'D' for captured rows, NULL for published events.
-- old_payload: the row before an UPDATE.
alter table ferry.events
    add column capture     integer,
    add column op          "char",
    add column old_payload jsonb;

-- The events of a batch: committed after start_tick and no later than end_tick,
-- in id order. Scans the txid range from start_tick's xmax (not its xmin, so
-- one long transaction cannot make every read slow) plus the few transactions
-- start_tick listed as in progress. Captured rows get their envelope here.
drop function if exists ferry.batch_events(bigint, bigint, text[]);
