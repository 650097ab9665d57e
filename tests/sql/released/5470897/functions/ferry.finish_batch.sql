-- ferry.finish_batch(consumer text, batch bigint) returns void
--
-- Acknowledges a consumer's open batch (ferry.next_batch): its cursor moves
-- to the batch's end tick. 55000 when the batch is not the consumer's open one.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers
-- Raises:  55000
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.finish_batch(consumer text, batch bigint) returns void
language plpgsql as $$
begin
    update ferry.consumers set tick_id = next_tick_id, next_tick_id = null, batch_id = null, updated_at = now()
    where name = consumer and batch_id = batch;
    if not found then
        raise exception 'pgferry: batch % is not the open batch of consumer %', batch, quote_literal(consumer)
            using errcode = '55000', hint = 'It was already acknowledged, or the consumer was reset.';
    end if;
end $$;
