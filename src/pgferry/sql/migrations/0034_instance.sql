-- pgferry 0034: each install has a random instance name, which the broker
-- sinks put in their duplicate checks.
--
-- A JetStream message's Nats-Msg-Id was <subscription>/evt_<id>, and a
-- Redis mark pgferry:dedup:<subscription>:..., neither naming the
-- database. JetStream drops a second message with an id it has seen in its
-- duplicate window, per stream; the Redis script skips an event whose id is
-- marked. Two databases (two shards, staging and production) with a
-- subscription of the same name publishing into one broker: the second
-- database's event of an id the first had sent was dropped as a duplicate,
-- and recorded as delivered (outside probe: 5 of 10 events in neither
-- broker, each side showing lag 0). The sinks now prefix both with this
-- name (delivery/jetstream.py, delivery/redis_streams.py).
--
-- A database restored from a backup goes on with the event ids after the
-- backup, which it may already have sent: give it a new name
-- (`update ferry.config set instance = default`) before its relay starts.
-- A relay of 0033 and one of this version, during a rolling upgrade, do
-- not recognise each other's re-sends: an event in flight then may be
-- stored twice, once.

alter table ferry.config add column instance text not null
    default substr(replace(gen_random_uuid()::text, '-', ''), 1, 16);

comment on column ferry.config.instance is
    'pgferry: this install''s name in the broker sinks'' duplicate checks (migration 0034); new after a restore.';
