-- pgferry 0016: ownership epochs. A relay delivers a subscription while its
-- ownership connection holds the consumer's advisory lock. When only that
-- connection dies (an operator terminates it, or a proxy cuts it on the
-- server's side), the lock is free at once and another relay claims the
-- subscription, while the first one's workers, on other connections, may not
-- have noticed yet: both would read, send and record the same batches.
--
-- So every claim bumps the consumer's owner_epoch (ferry._claim_consumer), the
-- worker carries the epoch it claimed, and every write it makes checks it
-- (ferry._fence, ferry.webhook_steps): a relay that
-- lost a subscription can neither read a new batch, nor record attempts,
-- parks and dead letters, nor move the cursor; it stops that worker. The
-- fence takes a share lock on the consumer row, so a claim waits for a
-- recording in progress to commit, and then reads the cursor it moved.

alter table ferry.consumers add column owner_epoch bigint not null default 0;

-- ferry.webhook_steps replaces it: the steps of many subscriptions in one
-- statement, each fenced by its epoch, one read per group of subscriptions at
-- the same position on the same streams. Both of its signatures: 0005's, and
-- the one with max_bytes, peek_until and resume_after that a database which
-- ran the byte bound on webhook_step (branch `memory`, 0015) has.
drop function if exists ferry.webhook_step(text, text, integer, boolean, bigint, bigint, bigint[], integer[], integer[],
                                           real[], boolean, bigint);
drop function if exists ferry.webhook_step(text, text, integer, boolean, bigint, bigint, bigint[], integer[], integer[],
                                           real[], boolean, bigint, integer, bigint, bigint);
