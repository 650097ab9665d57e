-- ferry.unregister_consumer(name text) returns boolean
--
-- Deletes a consumer, releasing what it held back of retention. Returns
-- whether it existed.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.unregister_consumer(name text) returns boolean
language sql as $$
    with d as (delete from ferry.consumers c where c.name = unregister_consumer.name returning 1)
    select exists (select 1 from d)
$$;
