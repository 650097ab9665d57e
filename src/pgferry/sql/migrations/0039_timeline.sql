-- pgferry 0039: the WAL timeline pgferry last saw, to notice a promotion or a restore.
--
-- Event ids come from ferry.event_id_seq, and receivers know an event by
-- its id: webhook-id evt_<id> (receivers are told to drop a second one),
-- JetStream's Nats-Msg-Id and Redis's duplicate marks (with the install's
-- name, ferry.config.instance, migration 0034), the streams API's offsets
-- (a tick and an id). A standby promoted after a failover has the
-- sequence as far as it had replayed the old primary's WAL: the events the
-- old primary committed after that (and delivered) are lost with it, and
-- the promoted server handed out their ids again, so a receiver that
-- de-duplicates dropped the new events as duplicates (outside probe: 100
-- new events under the webhook-ids of 100 lost ones; the Redis sink skipped
-- all 100 and they were recorded as delivered). The same after a restore
-- to a point in time.
--
-- Both start a new WAL timeline. The relay compares the server's with this
-- column (ferry.after_promotion, before its ticker's first tick and every
-- few seconds, and when its ownership connection connects) and on a change
-- moves the sequences whose values receivers see beyond anything the lost
-- timeline can have handed out, gives the install a new instance name, and
-- records the timeline. A new install records its timeline here; an
-- upgraded one too, as it is: nothing is moved.

alter table ferry.config add column timeline bigint;

update ferry.config set timeline = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;

comment on column ferry.config.timeline is
    'pgferry: the WAL timeline the event id sequences were last checked on (migration 0039); '
    'ferry.after_promotion moves them on when the server''s is another.';
