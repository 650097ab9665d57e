-- pgferry 0017: the byte bound of 0015 in ferry.webhook_steps.
--
-- Why: 0016 replaced ferry.webhook_step, where 0015 put the byte bound, by
-- ferry.webhook_steps (many subscriptions per statement). webhook_steps
-- gains the same arguments, per request where they differ between
-- subscriptions (spans: the events a range is sized for; peek_until and
-- resume_after: the rest of a range read in parts) and max_bytes for the
-- call, and an output column cut_after. The rule, for lone and shared
-- reads, is in its file (sql/functions/ferry.webhook_steps.sql).
--
-- The new arguments come last and default to NULL (no bound, as before),
-- and the new column comes last: a relay of 0016 keeps calling it,
-- unbounded, during a rolling upgrade. The signature without them goes.
--
-- Supersedes ferry.webhook_steps' signature of 0016 (sql/functions/ferry.webhook_steps.sql).

drop function if exists ferry.webhook_steps(text[], text[], bigint[], boolean[], bigint[], bigint[], boolean[],
                                            bigint[], integer[], bigint[], integer[], integer[], real[], integer);
