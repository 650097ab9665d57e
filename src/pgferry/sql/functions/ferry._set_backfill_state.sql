-- ferry._set_backfill_state(backfill bigint, state text, allowed_from text[]) returns text
--
-- Moves a backfill to state (cancelled, paused or running) when it is in one
-- of allowed_from, or leaves it when it is in state already. Waits for a
-- chunk in progress (its row lock), so that after a cancel or pause no
-- further chunk commits. Returns the state it is in afterwards.
--
-- Calls:   -
-- Reads:   ferry.backfills
-- Writes:  ferry.backfills
-- Raises:  42704 (no such backfill), 55000 (its state does not allow it, or running again
--          while another backfill of the table for the same readers is active: migration 0041)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default); used by ferry.backfill_cancel, _pause and _resume

create or replace function ferry._set_backfill_state(backfill bigint, state text, allowed_from text[])
returns text language plpgsql as $$
declare
    v_state text;
begin
    select f.state into v_state from ferry.backfills f where f.id = _set_backfill_state.backfill for update;
    if not found then
        raise exception 'pgferry: backfill % does not exist', backfill
            using errcode = '42704', hint = 'See `pgferry backfill --list`.';
    end if;
    if v_state = _set_backfill_state.state then
        return v_state;
    end if;
    if not v_state = any (allowed_from) then
        raise exception 'pgferry: backfill % is %, so it cannot be made %', backfill, v_state, _set_backfill_state.state
            using errcode = '55000', hint = 'Start a new backfill with ferry.backfill(...) instead.';
    end if;
    begin
        update ferry.backfills f
        set state = _set_backfill_state.state,
            reason = case when _set_backfill_state.state = 'running' then null else f.reason end,
            updated_at = clock_timestamp(),
            finished_at = case when _set_backfill_state.state = 'cancelled' then clock_timestamp() end
        where f.id = _set_backfill_state.backfill;
    exception when unique_violation or serialization_failure then
        -- backfills_one_active_idx (migration 0041): a failed one resumed beside another of the same
        -- table and readers, started after it failed, sent each row twice (outside probe)
        raise exception 'pgferry: backfill % cannot run again now: another backfill of the same table for the same '
                        'readers is running or paused, and both would send them its rows', backfill
            using errcode = '55000',
                  hint = 'See `pgferry backfill --list`; resume this one once that one is done, or cancel it.';
    end;
    return _set_backfill_state.state;
end $$;
