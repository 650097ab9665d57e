-- pgferry 0020: capture from the write-ahead log. A table captured with
-- method 'wal' has no trigger: it is in the publication pgferry manages, and
-- the relay holding the WAL capture lock decodes a logical replication slot
-- (pgoutput) into ferry.events, with the same envelope, stream and key as
-- trigger capture (capture/wal.py, ferry._append_wal).
--
-- Exactly once into the log: ferry.wal_slot.lsn is the position up to which
-- every committed transaction is in the log, written in the same transaction
-- as the events it covers; the slot is confirmed (advanced) only after that
-- commit, and on restart the changes of transactions committed before lsn
-- are skipped.

alter table ferry.captures add column method text not null default 'trigger'
    check (method in ('trigger', 'wal'));
comment on column ferry.captures.method is
    'trigger: statement triggers write events in the writer''s transaction; wal: the relay decodes them from the WAL.';

-- One row: this database's slot. Slot names are cluster-wide, so the name
-- carries the database's oid.
create table ferry.wal_slot (
    singleton      boolean     primary key default true check (singleton),
    slot_name      name        not null,
    publication    name        not null,
    lsn            pg_lsn      not null,
    committed_at   timestamptz,
    created_at     timestamptz not null default now(),
    caught_up_at   timestamptz not null default now(),
    invalidated_at timestamptz,
    note           text
);
comment on table ferry.wal_slot is
    'The logical replication slot WAL capture decodes: lsn is where the log is complete up to (written with the events).';
comment on column ferry.wal_slot.committed_at is 'Commit time of the last captured transaction appended.';
comment on column ferry.wal_slot.caught_up_at is
    'When the relay last appended (status counts WAL capture''s lag in seconds from it while it is behind).';
comment on column ferry.wal_slot.invalidated_at is
    'Set when PostgreSQL invalidated the slot (max_slot_wal_keep_size): changes were lost; see note.';

-- capture_table gained a parameter (method); its file defines the new one.
drop function if exists ferry.capture_table(regclass, text, text[], text[], text, text[], text[], text[]);
