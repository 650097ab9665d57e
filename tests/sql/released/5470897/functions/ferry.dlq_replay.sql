-- ferry.dlq_replay(subscription text, ids bigint[] default null) returns integer
--
-- Put dead letters back in line for delivery (fresh attempt budget). With no
-- ids, every dead letter of the subscription. Returns how many.
--
-- Calls:   -
-- Reads:   -
-- Writes:  ferry.dead_letters, ferry.retries
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.dlq_replay(subscription text, ids bigint[] default null) returns integer
language plpgsql as $$
declare
    n integer;
begin
    with moved as (
        delete from ferry.dead_letters d
        where d.subscription = dlq_replay.subscription and (ids is null or d.id = any (ids))
          -- an event already parked again (e.g. replayed twice) keeps its dead letter
          and not exists (select 1 from ferry.retries r where r.subscription = d.subscription and r.event_id = d.event_id)
        returning d.*
    )
    insert into ferry.retries (subscription, event_id, stream, key, payload, headers, event_created_at,
                               attempts, first_failed_at, next_attempt_at, last_status, last_error, last_response)
    select m.subscription, m.event_id, m.stream, m.key, m.payload, m.headers, m.event_created_at,
           0, now(), now(), m.last_status, m.last_error, m.last_response
    from moved m
    on conflict do nothing;
    get diagnostics n = row_count;
    return n;
end $$;
