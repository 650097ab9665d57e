-- ferry._drop_drained_consumer(consumer text) returns boolean
--
-- Removes a partition's consumer that drained after a change of partitions
-- (ferry._subscription_consumers), once its owner's worker has stopped and
-- recorded everything: only if it has reached its drain_to. The gaps
-- retention recorded for it (ferry.gaps, migration 0014) move to the first
-- current partition of its subscription first: they are the subscription's
-- history, and the foreign key's cascade deleted them with the consumer
-- (outside probe: 4,080 lost events no longer in status or trace after a
-- change of partitions).
-- Returns whether it was removed.
--
-- Calls:   -
-- Reads:   ferry.consumers
-- Writes:  ferry.consumers, ferry.gaps
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay)

create or replace function ferry._drop_drained_consumer(consumer text) returns boolean
language plpgsql as $$
declare
    d ferry.consumers;
begin
    select * into d from ferry.consumers c
    where c.name = _drop_drained_consumer.consumer and c.drain_to is not null and c.tick_id >= c.drain_to
    for update;
    if not found then
        return false;
    end if;
    update ferry.gaps g
    set consumer = (select c.name from ferry.consumers c where c.subscription = d.subscription and c.drain_to is null
                    order by c.part limit 1)
    where g.consumer = d.name
      and exists (select 1 from ferry.consumers c where c.subscription = d.subscription and c.drain_to is null);
    delete from ferry.consumers c where c.name = d.name;
    return true;
end $$;
