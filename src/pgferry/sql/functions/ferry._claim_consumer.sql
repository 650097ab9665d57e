-- ferry._claim_consumer(consumer text) returns bigint
--
-- A relay that just took the consumer's advisory lock starts a new ownership
-- epoch and returns it (migration 0016); NULL when a recording by the former
-- owner holds the consumer row for more than a second (the caller gives the
-- lock back and tries again on its next round) or the consumer is gone.
-- The claim of relays of the previous release, kept for them during a
-- rolling upgrade; relays now claim a round's consumers in one statement
-- (ferry._claim_consumers). Goes in a later release.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.consumers
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._claim_consumer(consumer text) returns bigint
language plpgsql as $$
declare
    v_epoch bigint;
begin
    perform set_config('lock_timeout', '1s', true);
    update ferry.consumers set owner_epoch = owner_epoch + 1 where name = consumer returning owner_epoch into v_epoch;
    perform set_config('lock_timeout', '0', true);
    return v_epoch;
exception when lock_not_available then
    return null;
end $$;
