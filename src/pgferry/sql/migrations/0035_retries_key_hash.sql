-- pgferry 0035: parked events are found by their key's hash.
--
-- retries_key_idx was a btree on (subscription, key, event_id), and a btree
-- entry holds at most 2,704 bytes. An event whose key was longer (keys are
-- not bounded: a writer's key, a long text primary key) could not be parked
-- after a failed attempt: recording the failure failed, the worker started
-- again and sent its batch again, for good (outside probe: two good events
-- delivered 15 times in 30 s, the failing one tried 15 times under
-- max_attempts 3, no attempt recorded). The index now holds the key's
-- 64-bit hash instead, whatever the key's length; the statements that look a
-- subscription's parked events up by key compare the hashes (the index) and
-- then the keys (the answer). A hash index on the key alone also took any
-- length, but found a key's parked events of every subscription: with 1,000
-- subscriptions parked on the same keys a retry read took 11.8 ms instead of
-- 1.6 ms. Relays older than this migration still find them, without the
-- index (by subscription and event id).

drop index ferry.retries_key_idx;

create index retries_key_idx on ferry.retries (subscription, hashtextextended(key, 0), event_id);
