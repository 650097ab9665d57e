-- ferry._advance_consumers(consumers text[], from_ticks bigint[], to_ticks bigint[], epochs bigint[]) returns text[]
--
-- Moves many cursors in one statement: the relay's LogWatch moving the
-- subscriptions it delivers over ranges that held nothing for them, so that
-- an idle subscription costs no query of its own. Like
-- ferry.advance_consumer, a cursor moves only from where the caller thinks
-- it is, and only while it still belongs to the caller's ownership epoch
-- (migration 0016); returns the consumers that were elsewhere (another
-- process moved or claimed them), which are left alone.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._advance_consumers(consumers text[], from_ticks bigint[], to_ticks bigint[],
                                                    epochs bigint[])
returns text[]
language sql as $$
    with wanted as (
        select * from unnest(consumers, from_ticks, to_ticks, epochs) as w(name, from_tick, to_tick, epoch)
    ), moved as (
        update ferry.consumers c set tick_id = w.to_tick, next_tick_id = null, batch_id = null, updated_at = now()
        from wanted w
        where c.name = w.name and c.tick_id = w.from_tick and (w.epoch is null or c.owner_epoch = w.epoch)
        returning c.name
    )
    select coalesce(array_agg(w.name), '{}') from wanted w where w.name not in (select m.name from moved m)
$$;
