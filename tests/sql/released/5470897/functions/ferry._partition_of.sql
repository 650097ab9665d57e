-- ferry._partition_of(key text, id bigint, parts integer) returns integer
--
-- The partition (0 .. parts-1) of a partitioned subscription that delivers an
-- event (migration 0018): by a hash of its key, so that all events of a key
-- go through one partition and keep their order; events without a key by
-- their id (they have no order to keep). Always 0 for parts <= 1. The hash is
-- PostgreSQL's own (hashtextextended, the one hash partitioning uses): stable
-- across restarts and versions, so a key never moves while parts stays.
-- A SQL function so that it is inlined into the reads that call it.
--
-- Parameters: key, id   the event's key and id
--             parts     the subscription's number of partitions
-- Returns:    the partition number.
-- Calls:      -
-- Reads:      -
-- Writes:     -
-- Raises:     -
-- Runs as:    the caller (SECURITY INVOKER)
-- Callers:    PUBLIC (the default)

create or replace function ferry._partition_of(key text, id bigint, parts integer)
returns integer language sql immutable parallel safe as $$
    select case when parts is null or parts <= 1 then 0
                when key is null then (id % parts)::integer
                else ((hashtextextended(key, 0) & 9223372036854775807) % parts)::integer end
$$;
