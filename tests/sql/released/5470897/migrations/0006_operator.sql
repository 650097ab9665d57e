-- pgferry 0006: what operators need to see and fix delivery.
--
-- * ferry.subscriptions.managed_by: who manages a subscription declaratively
--   (`pgferry apply` writes 'apply'), so that applying a file only ever
--   removes subscriptions that an earlier apply created, never ones made by
--   hand or by SQL (unless asked to with --prune).
-- * ferry.lookup_event: one event as readers see it (captured rows with their
--   envelope), for `pgferry trace` and the dashboard's trace page.
-- * ferry.replay / ferry.replay_count: put events of the retained log that a
--   subscription has already passed back in line for delivery, in chunks of
--   tick ranges, so a long replay reads the log once, shows progress and
--   never holds one huge transaction.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

alter table ferry.subscriptions add column managed_by text;

comment on column ferry.subscriptions.managed_by is
    'Set by `pgferry apply` (''apply''): such subscriptions are removed when they leave the file. NULL: made by hand.';

-- Recent failures (dashboard, `pgferry status`) without walking past every
-- success: only failed attempts are indexed, so the index stays small.
create index attempts_failed_idx on ferry.attempts (id) where error_class is not null;
