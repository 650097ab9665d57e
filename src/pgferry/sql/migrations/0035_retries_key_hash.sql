-- pgferry 0035: parked events are found by key through a hash index.
--
-- retries_key_idx was a btree on (subscription, key, event_id), and a btree
-- entry holds at most 2,704 bytes. An event whose key was longer (keys are
-- not bounded: a writer's key, a long text primary key) could not be parked
-- after a failed attempt: recording the failure failed, the worker started
-- again and sent its batch again, for good (outside probe: two good events
-- delivered 15 times in 30 s, the failing one tried 15 times under
-- max_attempts 3, no attempt recorded). A hash index stores the key's hash,
-- whatever its length, and answers the only question asked of it: the
-- subscription's other parked events of the same key (equality; the
-- subscription and event id are checked on the rows it finds).

drop index ferry.retries_key_idx;

create index retries_key_idx on ferry.retries using hash (key);
