-- pgferry 0021: a change WAL capture cannot append (a capture condition
-- that raises for a committed row, a column it names dropped, ...) holds
-- WAL capture at that change until the capture is fixed: nothing after it
-- may enter the log before it. The relay keeps the error here, where
-- `pgferry status`, the dashboard and metrics show it, retries every few
-- seconds, and clears it with the first round it appends.

alter table ferry.wal_slot add column error text, add column error_at timestamptz;
comment on column ferry.wal_slot.error is
    'Why WAL capture cannot append the next change (NULL: it can); it retries, holding every later change.';
comment on column ferry.wal_slot.error_at is 'Since when WAL capture has been failing with error.';
