-- ferry._fence(consumer text, epoch bigint) returns void
--
-- The first statement of every transaction in which a relay's worker records
-- what it delivered: passes when the consumer still belongs to the worker's
-- ownership epoch, and holds the consumer row (FOR SHARE) until commit, so
-- that a new owner's ferry._claim_consumers skips the consumer until this
-- recording is over, and then reads the cursor it leaves. Raises PF002 when another relay claimed the
-- consumer since (migration 0016), 42704 when it was removed (its subscription unsubscribed: a
-- worker told "another relay" logged a warning for an ordinary removal; outside probe).
--
-- Calls:   -
-- Reads:   ferry.consumers
-- Writes:  -
-- Raises:  PF002, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._fence(consumer text, epoch bigint) returns void
language plpgsql as $$
begin
    perform 1 from ferry.consumers c where c.name = consumer and c.owner_epoch = epoch for share;
    if not found then
        if not exists (select 1 from ferry.consumers c where c.name = consumer) then
            raise exception 'pgferry: consumer % was removed', quote_literal(consumer) using errcode = '42704';
        end if;
        raise exception 'pgferry: consumer % now belongs to another relay (ownership epoch % is over)',
            quote_literal(consumer), epoch
            using errcode = 'PF002', hint = 'This relay stops delivering it; the new owner goes on from its cursor.';
    end if;
end $$;
