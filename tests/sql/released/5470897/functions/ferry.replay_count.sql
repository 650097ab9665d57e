-- ferry.replay_count(subscription text, since timestamptz default null, from_event bigint default null) returns bigint
--
-- How many retained events ferry.replay would queue for a subscription
-- (since a time, or from an event id).
--
-- Calls:   ferry._replayable
-- Reads:   -
-- Writes:  -
-- Raises:  22023, 42704
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry.replay_count(subscription text, since timestamptz default null, from_event bigint default null)
returns bigint language sql stable as $$
    select count(*) from ferry._replayable(subscription, since, from_event)
$$;
