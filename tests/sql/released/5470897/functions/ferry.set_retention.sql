-- ferry.set_retention(max_retention interval, max_retention_bytes bigint default null) returns void
--
-- Sets the retention limit (migration 0014), declared whole: how far behind
-- a consumer may fall before it is stalled and stops holding the log back,
-- in time (max_retention, the age of the oldest tick its cursor has not
-- passed) and in size (max_retention_bytes, the log's partitions with their
-- indexes; NULL: no size cap). Refuses, with 22023, a limit that is not
-- positive or one shorter than rotation_interval (every event stays at
-- least that long anyway, so such a limit would only stall consumers for
-- nothing).
--
-- Calls:   -
-- Reads:   ferry.config
-- Writes:  ferry.config
-- Raises:  22023
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.set_retention(max_retention interval, max_retention_bytes bigint default null)
returns void language plpgsql as $$
declare
    v_rotation interval := (select c.rotation_interval from ferry.config c);
begin
    if max_retention is null or max_retention <= interval '0' then
        raise exception 'pgferry: max_retention must be a positive interval such as ''7 days'', got %',
            coalesce(max_retention::text, 'NULL') using errcode = '22023';
    end if;
    if max_retention < v_rotation then
        raise exception 'pgferry: max_retention (%) must be at least rotation_interval (%)', max_retention, v_rotation
            using errcode = '22023',
                  hint = 'Every event stays in the log at least rotation_interval; a shorter limit would stall consumers for nothing.';
    end if;
    if max_retention_bytes is not null and max_retention_bytes <= 0 then
        raise exception 'pgferry: max_retention_bytes must be a positive number of bytes or NULL (no size cap), got %',
            max_retention_bytes using errcode = '22023';
    end if;
    update ferry.config c set max_retention = set_retention.max_retention,
                              max_retention_bytes = set_retention.max_retention_bytes;
end $$;
