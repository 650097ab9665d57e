-- pgferry 0032: a relay passes a round's attempts to ferry.webhook_steps as
-- runs (attempt_runs): the request, attempt number, status and latency of
-- each run of events that share them, once, instead of once per event.
--
-- The new argument comes last and defaults to NULL (one event per attempt,
-- as before): a relay of 0031 keeps calling it during a rolling upgrade.
-- The signature without it goes.
--
-- Supersedes ferry.webhook_steps' signature of 0023 (sql/functions/ferry.webhook_steps.sql).

drop function if exists ferry.webhook_steps(text[], text[], bigint[], boolean[], bigint[], bigint[], boolean[], bigint[],
                                            integer[], bigint[], integer[], integer[], real[], integer, integer,
                                            integer[], bigint[], bigint[], bigint[], bigint[]);
