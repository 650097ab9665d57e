-- ferry._subscription_consumers(p_subscription text, p_streams text[], p_start_at text, p_parts integer) returns void
--
-- Gives a subscription its consumers, one per partition (migration 0018;
-- names: ferry._partition_consumer), all reading p_streams.
--  - New (no consumer yet): p_parts consumers starting at p_start_at.
--  - Same number of partitions: only the streams change.
--  - Another number, on a live subscription: at the newest tick T, the
--    current consumers get drain_to = T (they read up to T and no further)
--    and the new ones start at T. ferry.webhook_steps gives the new ones
--    nothing to read until every draining one has reached T, and the relay
--    that owns a drained one stops it and removes it (ferry.relay_round).
--    The switch happens at a tick boundary: every event committed by T
--    goes through its old partition, every later one through its new one,
--    and a key's events after T wait for all of its events up to T.
--
-- Parameters: p_subscription   the subscription (its row exists)
--             p_streams        its streams
--             p_start_at       'now' or 'beginning' (new consumers only)
--             p_parts          its number of partitions, 1-256
-- Returns:    nothing.
-- Calls:      ferry.register_consumer, ferry._partition_consumer
-- Reads:      ferry.ticks
-- Writes:     ferry.consumers
-- Raises:     55000 when an earlier change of partitions is still draining;
--             22023 from ferry.register_consumer (start_at)
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._subscription_consumers(
    p_subscription text, p_streams text[], p_start_at text, p_parts integer)
returns void language plpgsql as $$
declare
    v_parts integer;
    v_tick bigint;
    v_name text;
    v_part integer;
begin
    -- Every consumer of the subscription reads its streams, a draining one too.
    update ferry.consumers c set streams = p_streams, updated_at = now()
    where c.subscription = p_subscription and c.streams is distinct from p_streams;
    select c.parts into v_parts from ferry.consumers c
    where c.subscription = p_subscription and c.drain_to is null
    limit 1;
    if v_parts = p_parts then
        return;
    end if;
    if v_parts is null then
        for v_part in 0 .. p_parts - 1 loop
            v_name := ferry._partition_consumer(p_subscription, v_part, p_parts);
            perform ferry.register_consumer(v_name, p_streams, p_start_at);
            update ferry.consumers c set subscription = p_subscription, part = v_part, parts = p_parts
            where c.name = v_name;
        end loop;
        return;
    end if;
    if exists (select 1 from ferry.consumers c where c.subscription = p_subscription and c.drain_to is not null) then
        raise exception 'pgferry: subscription % is still switching to % partitions', quote_literal(p_subscription), v_parts
            using errcode = '55000',
                  hint = 'Its old partitions are delivering what they had before the switch; `pgferry status` shows '
                         'them as draining. Change partitions again once they are gone.';
    end if;
    select max(t.id) into v_tick from ferry.ticks t;
    update ferry.consumers c set drain_to = v_tick, updated_at = now() where c.subscription = p_subscription;
    insert into ferry.consumers (name, streams, tick_id, subscription, part, parts)
    select ferry._partition_consumer(p_subscription, g.p, p_parts), p_streams, v_tick, p_subscription, g.p, p_parts
    from generate_series(0, p_parts - 1) as g(p);
end $$;
