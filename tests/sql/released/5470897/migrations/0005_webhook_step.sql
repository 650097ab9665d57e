-- pgferry 0005: webhook batches are pipelined, one round trip per batch.
--
-- A webhook worker used to take one batch at a time: open it, send it,
-- record it and acknowledge it, and only then open the next; under load the
-- waits for the database and the endpoint added up in the commit-to-receipt
-- tail. Now a worker reads a batch ahead (ferry.webhook_step with peek) while
-- earlier ones are still being sent, and moves the consumer's cursor over
-- finished batches strictly in order, in the same call that reads the next
-- one. Nothing changes for the guarantee: the cursor only passes a batch
-- whose every event was delivered, parked or dead-lettered; a crash re-sends
-- whatever the cursor had not passed, with the same webhook-ids.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

-- Superseded by webhook_step.
drop function if exists ferry.next_webhook_batch(text, integer);

drop function if exists ferry.record_delivered_batch(text, text, bigint, bigint[], integer[], integer[], real[]);
