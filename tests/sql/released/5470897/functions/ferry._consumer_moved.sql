-- ferry._consumer_moved() returns trigger
--
-- A consumer's progress inside a range read in parts (part_start, part_end,
-- part_done; migration 0023) belongs to the tick its cursor is at: when the
-- cursor moves, by any path (an acknowledgement, a replay, retention's skip,
-- an operator), it is cleared, unless the same update sets it for the new
-- tick (an acknowledgement that ends one range and a part of the next).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._consumer_moved() returns trigger language plpgsql as $$
begin
    if new.tick_id is distinct from old.tick_id and new.part_start is distinct from new.tick_id then
        new.part_start := null;
        new.part_end := null;
        new.part_done := null;
    end if;
    return new;
end $$;

create or replace trigger consumers_moved before update of tick_id on ferry.consumers
    for each row execute function ferry._consumer_moved();
