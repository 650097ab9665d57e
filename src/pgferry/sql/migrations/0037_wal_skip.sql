-- pgferry 0037: one change WAL capture cannot append, skipped on its own.
--
-- A json value jsonb cannot hold ('{"a": 1e1000000}', a string holding
-- \u0000: PostgreSQL's json keeps them as text) is committed in the WAL,
-- and the log's record, jsonb, refuses it: WAL capture holds at that change
-- (migration 0021) and no correction reaches it. The only way past it was
-- ferry.reset_wal_slot() with every relay stopped, which made the changes
-- not yet appended of every WAL-captured table a gap and asked for a
-- backfill of each. Now the operator names the change by its WAL position
-- (the relay's error gives it): select ferry.skip_wal_change('X/Y');
-- records it in ferry.wal_slot.skip_lsns, and the relay, at its next try,
-- leaves that change out of the append and records it, in the same
-- transaction (ferry._record_wal_skip), as a gap (cause 'wal change
-- skipped', events 1, from_lsn = to_lsn = its position) of each consumer
-- reading its table's stream, whose reason names the row to backfill.
-- A list, not one position: one transaction may hold several such changes,
-- and the append of its round fails at each until all are skipped.
--
-- moved_cursor (migration 0027) was "events is not null": a skipped change
-- has a count (1) but moved no cursor either, so a gap over a WAL range
-- (from_lsn set) is one whose changes never reached the log, whatever its
-- count. PostgreSQL 15 cannot change a generated column's expression: the
-- column is made again (same values for every row there is: every WAL gap
-- so far has events NULL).

alter table ferry.wal_slot add column skip_lsns pg_lsn[];
comment on column ferry.wal_slot.skip_lsns is
    'Positions of changes the operator chose to skip (ferry.skip_wal_change): WAL capture leaves out such a change '
    'the log cannot hold and records it as a gap (ferry._record_wal_skip); each is removed once recorded.';

alter table ferry.gaps drop column moved_cursor;
alter table ferry.gaps
    add column moved_cursor boolean generated always as (events is not null and from_lsn is null) stored;

comment on column ferry.gaps.moved_cursor is
    'The consumer''s cursor moved over events the log held (retention, a resume): a gap that stalls it. '
    'False for WAL capture''s gaps (from_lsn set: a lost slot, a skipped change): their changes never reached the log '
    'and no cursor moved.';
comment on column ferry.gaps.from_lsn is
    'WAL capture''s gaps: cause ''wal slot lost'', the changes committed after this WAL position are not in the log; '
    'cause ''wal change skipped'', the position of the change skipped.';
comment on column ferry.gaps.to_lsn is
    'cause ''wal slot lost'': ... up to this one, where ferry.reset_wal_slot started the new slot (NULL: not reset yet); '
    'cause ''wal change skipped'': from_lsn.';
comment on column ferry.gaps.events is
    'Events the consumer never got; NULL for a lost WAL slot (the changes never reached the log: how many is unknown).';
