-- pgferry 0008: say so when a subscription names a stream nothing has written.
--
-- Supersedes ferry.subscribe of 0004_roles.sql (itself replacing 0002) and
-- ferry.housekeeping of 0002_webhooks.sql. Both keep their signature, their
-- privileges (CREATE OR REPLACE keeps a function's ACL; the grants are
-- restated below all the same) and everything they did; subscribe now also
-- raises a NOTICE per unwritten stream, and housekeeping also keeps the
-- stream catalog below.
--
-- A subscription to "public.ordrs" used to be accepted without a word and
-- then sat idle forever. It is still accepted (a stream may legitimately be
-- written for the first time later), but subscribe now says, as a NOTICE,
-- which of its streams nothing has written yet, and `pgferry status` shows it
-- next to such a subscription's idle state.
--
-- A stream is known when a captured table writes it (ferry.captures), when it
-- is 'net.http' and the pg_net add-on is installed, or when the log holds an
-- event of it. The log has no index on stream, and adding one would cost
-- every writer. Without one, `exists (select 1 from ferry.events where
-- stream = $1)` must read the whole log when the stream is absent, which is
-- exactly the case in question: measured on a 1,000,000-event log (361 MB,
-- 2 cores, warm cache) it took 130-205 ms with a parallel sequential scan,
-- and it grows with the log (retention keeps whatever consumers have not
-- passed) and with the status page, which would pay it again on every
-- refresh. Bounding it to recent partitions is no better: the current
-- partition grows without bound while any consumer lags behind.
--
-- So the relay keeps a small catalog of streams, off the writer's path:
-- ferry.streams holds every stream an event was ever seen in, and
-- ferry.stream_scan the snapshot up to which the log has been catalogued.
-- housekeeping (the elected relay, every 5 s) reads the events committed
-- since, through the txid index, exactly as a batch is read, and adds their
-- streams. The check is then a primary-key lookup plus a txid-index range
-- scan of the events committed since the last housekeeping (a few seconds'
-- worth), and it is sound: an event visible in the catalogued snapshot was
-- catalogued (the first snapshot is taken before the seeding scan below, and
-- every later scan covers what became visible since the previous one), and
-- an event not visible in it has a txid at or above that snapshot's xmax or
-- in its xip list, which the range scan covers. The catalog also remembers
-- streams whose events retention has since dropped (housekeeping catalogues
-- before it truncates), which only ever says "known", never the reverse.
-- Measured on the same log: the check takes about 1 ms; catalogued by housekeeping,
-- 200,000 new events (2,000 transactions) took 131 ms, i.e. one more read of
-- each event by the relay at ~0.65 us (a batch read costs ~5 us per event,
-- see 0007). Without a running relay nothing is catalogued, and the check
-- reads what was written since (63 ms for those 200,000 events).
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

create table ferry.streams (
    stream          text        primary key,
    first_event_at  timestamptz not null
);

comment on table ferry.streams is
    'pgferry: every stream an event was ever written to, kept by ferry.housekeeping (see migration 0008).';

create table ferry.stream_scan (
    singleton   boolean     primary key default true check (singleton),
    scanned_to  pg_snapshot not null,
    scanned_at  timestamptz not null default now()
);

comment on table ferry.stream_scan is
    'pgferry: the snapshot up to which ferry.streams has catalogued the log.';

-- The snapshot first, then the log: whatever it shows as committed is seen by the scan after it.
insert into ferry.stream_scan (scanned_to) values (pg_current_snapshot());

insert into ferry.streams (stream, first_event_at)
select e.stream, min(e.created_at) from ferry.events e group by e.stream;

---------------------------------------------------------------------------
-- Privileges: as 0004 granted them, restated; the new tables and functions
-- for the relay. Writers get nothing here: they cannot read the log, the
-- captures or the subscriptions, so the new functions fail for them (42501).
---------------------------------------------------------------------------

grant select, insert, update, delete, truncate on ferry.streams, ferry.stream_scan to ferry_relay;
