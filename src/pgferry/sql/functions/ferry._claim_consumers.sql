-- ferry._claim_consumers(lock_class integer, consumers text[], most integer) returns table (consumer text, lock_key integer, epoch bigint)
--
-- A relay's claims of one ownership round, in one statement: for each of
-- consumers in order, until most are claimed, takes its session advisory
-- lock (lock_class, hashtext(consumer)) when no relay holds it and starts a
-- new ownership epoch (migration 0016), which fences off a former owner
-- that has not noticed yet. A consumer whose row is locked (its former
-- owner is recording: ferry._fence holds it until commit) or that is gone
-- is returned with a NULL epoch and its lock given back: the relay tries
-- again next round, and then reads the cursor that recording left. Those
-- whose lock another relay holds are not returned. One round trip for a
-- round's claims: three per consumer made a relay starting with 5,000
-- subscriptions take a minute to claim them (outside probe);
-- ferry._claim_consumer, one at a time, stays for relays of the previous
-- release during an upgrade.
--
-- Calls:   -
-- Reads:   ferry.consumers
-- Writes:  ferry.consumers
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay)

create or replace function ferry._claim_consumers(lock_class integer, consumers text[], most integer)
returns table (consumer text, lock_key integer, epoch bigint)
language plpgsql as $$
declare
    v_name text;
    v_claimed integer := 0;
begin
    foreach v_name in array consumers loop
        exit when v_claimed >= most;
        consumer := v_name;
        lock_key := hashtext(v_name);
        continue when not pg_try_advisory_lock(lock_class, lock_key);
        perform 1 from ferry.consumers c where c.name = v_name for update skip locked;
        if found then
            update ferry.consumers c set owner_epoch = c.owner_epoch + 1 where c.name = v_name
            returning c.owner_epoch into epoch;
            v_claimed := v_claimed + 1;
        else
            perform pg_advisory_unlock(lock_class, lock_key);
            epoch := null;
        end if;
        return next;
    end loop;
end $$;

grant execute on function ferry._claim_consumers(integer, text[], integer) to ferry_relay;
