-- pgferry 0015: batch reads bounded in bytes as well as in events.
--
-- Why: the relay read a whole batch (up to max_batch_events, 5,000 by
-- default) into memory at once. A backlog of 1,500 captured rows of ~600 KB
-- took a relay to 1,274 MB; 5,000 events of 1 MB would take gigabytes, get
-- the relay killed for memory, and the restarted relay would read the same
-- batch again: a crash loop that delivers nothing.
--
-- ferry.webhook_step gains max_bytes (and, to continue a read the bound cut
-- short, peek_until and resume_after; docs in its file). The rule, argued in
-- ferry._batch_split.sql: a read stops once its events reach max_bytes (at
-- least one event, however large) and then ends at the furthest tick whose
-- events it holds in full, so the cursor moves as before; only when no tick
-- boundary fits (one transaction larger than the bound) does it hand out
-- part of a range, whose cursor move waits for the range's last part.
--
-- ferry.retries gains payload_bytes, the size of its payload as JSON text,
-- so that the retry loop's due_retries can stop at a byte bound without
-- rendering every due payload to measure it. It is generated, so every
-- way into ferry.retries (parking, dlq_replay, replay) fills it.
--
-- The new arguments default to NULL (no bound), and the columns a relay
-- selects are all still there: a relay older than this migration keeps
-- delivering (unbounded) during a rolling upgrade.
--
-- Supersedes ferry.webhook_step's signature of 0005 (sql/functions/ferry.webhook_step.sql).

drop function if exists ferry.webhook_step(text, text, integer, boolean, bigint, bigint, bigint[], integer[], integer[],
                                           real[], boolean, bigint);

alter table ferry.retries add column payload_bytes integer generated always as (octet_length(payload::text)) stored;
