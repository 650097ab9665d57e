-- ferry.backfill_resume(backfill bigint, chunk_size integer default null) returns text
--
-- Makes a paused or failed backfill running again, to go on after its last
-- chunk (a failed one after its cause was fixed); a runner must then drive
-- it (`pgferry backfill --resume ID`). With chunk_size, its next chunks take
-- that many rows (`--resume ID --chunk N`: a chunk that statement_timeout
-- cancels every time needs a smaller one, without starting over).
-- Returns the state afterwards ('running'; also when it was running already).
--
-- Calls:   ferry._set_backfill_state
-- Reads:   ferry.backfills
-- Writes:  ferry.backfills
-- Raises:  42704, 55000, 22023 (chunk_size below 1)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.backfill_resume(backfill bigint, chunk_size integer default null)
returns text language plpgsql as $$
declare
    v_state text;
begin
    if chunk_size < 1 then
        raise exception 'pgferry: chunk_size must be at least 1, not %', chunk_size using errcode = '22023';
    end if;
    v_state := ferry._set_backfill_state(backfill, 'running', array['paused', 'failed']);
    if chunk_size is not null then
        update ferry.backfills f set chunk_size = backfill_resume.chunk_size
        where f.id = backfill_resume.backfill;
    end if;
    return v_state;
end $$;
