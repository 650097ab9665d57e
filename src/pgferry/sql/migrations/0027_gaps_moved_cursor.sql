-- pgferry 0027: which gaps stall a consumer is one column of ferry.gaps, not a
-- cause each reader leaves out by name. A gap that moved a consumer's cursor
-- over events the log held (retention, a resume from now) is what stalls it,
-- what ferry.next_batch names and what ferry.maintain waits for before it
-- lifts a stall; a WAL capture's lost slot (migration 0025) moved no cursor:
-- its changes never reached the log, so it has no events to count (NULL).
-- next_batch, maintain and retention_status each left those out with
-- cause <> 'wal slot lost'; they test moved_cursor now, defined here once
-- from that property, so a new kind of gap, or the next reader of the
-- table, cannot get it wrong by name.

alter table ferry.gaps
    add column moved_cursor boolean generated always as (events is not null) stored;

comment on column ferry.gaps.moved_cursor is
    'The consumer''s cursor moved over events the log held (retention, a resume): a gap that stalls it. '
    'False for a WAL capture''s lost slot: its changes never reached the log (events NULL) and no cursor moved.';
