-- ferry._partition_consumer(subscription text, part integer, parts integer) returns text
--
-- The consumer that reads partition `part` of `parts` of a subscription
-- (migration 0018): 'webhook:<name>' for an unpartitioned one (as before
-- 0018), else 'webhook:<name>#<part>/<parts>'. Subscription names cannot
-- hold '#' or '/', so these never collide with another subscription's, and
-- partitions of a drain in progress never collide with their successors'.
-- The relay computes the same names (pgferry.delivery.model.consumer_name).
--
-- Parameters: subscription   its name
--             part, parts    which partition, of how many
-- Returns:    the consumer's name.
-- Calls:      -
-- Reads:      -
-- Writes:     -
-- Raises:     -
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._partition_consumer(subscription text, part integer, parts integer)
returns text language sql immutable parallel safe as $$
    select case when parts <= 1 then 'webhook:' || subscription
                else format('webhook:%s#%s/%s', subscription, part, parts) end
$$;
