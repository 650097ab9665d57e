-- pgferry 0022: which capture a change decoded from the WAL belongs to is
-- decided by where the change is in the WAL, not by what is captured when
-- the relay gets to it. A table switched to trigger capture, uncaptured, or
-- captured again with other options while some of its changes were not yet
-- decoded lost those changes (or had them written under the new options).
-- captured_lsn and uncaptured_lsn bound the changes a WAL capture owns: the
-- WAL insert position when capture_table made it and when it ended.
-- ferry._append_wal takes each change's position (a new argument).

alter table ferry.captures add column captured_lsn pg_lsn, add column uncaptured_lsn pg_lsn;
comment on column ferry.captures.captured_lsn is
    'WAL capture: changes at or after this WAL position are this capture''s (NULL: every change).';
comment on column ferry.captures.uncaptured_lsn is
    'WAL capture: changes before this WAL position are still this capture''s, though it ended.';

drop function if exists ferry._append_wal(pg_lsn, pg_lsn, timestamptz, oid[], "char"[], jsonb[], jsonb[], jsonb[],
                                          timestamptz[]);
