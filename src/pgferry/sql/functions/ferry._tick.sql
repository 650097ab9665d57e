-- ferry._tick(force boolean default false, out tick_id bigint, out idle boolean) returns setof record
--
-- Records a tick with the snapshot of now when something committed since the
-- last one (or when the last tick is older than idle_tick_interval), and
-- sends one NOTIFY for it. Returns the new tick id and whether it was only an
-- idle tick, or no row. Waits for nothing: with WAL capture running, the
-- relay's ticker calls ferry._tick_fenced instead (migration 0028); a tick
-- taken here may see a transaction whose WAL-captured changes are not in the
-- log yet, which the relay then appends in a later batch (never in none).
--
-- Calls:   ferry._tick_snapshot
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._tick(force boolean default false, out tick_id bigint, out idle boolean)
returns setof record language plpgsql as $$
begin
    -- One tick at a time, even if someone calls ferry.tick() by hand while the
    -- relay's ticker runs: tick ids must follow snapshot order, so the
    -- snapshot is taken once the lock is held.
    perform pg_advisory_xact_lock(28774, 4);
    return query select * from ferry._tick_snapshot(force, pg_current_snapshot());
end $$;
