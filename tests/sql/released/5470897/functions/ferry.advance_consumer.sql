-- ferry.advance_consumer(consumer text, from_tick bigint, to_tick bigint) returns void
--
-- Moves consumer's cursor from from_tick to to_tick, dropping any batch it
-- had open. Raises PF001 when the cursor is not at from_tick: another
-- process moved it (two relays briefly delivering one subscription), and
-- the caller must start over from wherever the cursor is now.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers
-- Raises:  PF001
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.advance_consumer(consumer text, from_tick bigint, to_tick bigint) returns void
language plpgsql as $$
begin
    update ferry.consumers set tick_id = to_tick, next_tick_id = null, batch_id = null, updated_at = now()
    where name = consumer and tick_id = from_tick;
    if not found then
        raise exception 'pgferry: consumer % is no longer at tick %', quote_literal(consumer), from_tick
            using errcode = 'PF001', hint = 'Another process moved it; read again from its current position.';
    end if;
end $$;
