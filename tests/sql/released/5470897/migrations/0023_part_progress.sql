-- pgferry 0023: how far a relay got in a range it reads in parts. Everything
-- written while no relay ran falls in one tick range (nothing ticks without
-- a relay), read in parts (cut_after) whose progress only the worker knew:
-- a worker that failed in the middle sent every part of the range again
-- (21,004 duplicates after a 90 s outage, outside probe). Acknowledging a
-- part now keeps its end here (ferry.webhook_steps' ack_part_end and
-- ack_part_done), and a read from the cursor resumes after it. Valid only
-- while tick_id = part_start: ferry._consumer_moved clears the three when
-- the cursor moves by any path.

alter table ferry.consumers add column part_start bigint, add column part_end bigint, add column part_done bigint;
comment on column ferry.consumers.part_done is
    'The range (part_start, part_end] is delivered up to this event id (its parts so far); NULL: none.';

drop function if exists ferry.webhook_steps(text[], text[], bigint[], boolean[], bigint[], bigint[], boolean[], bigint[],
                                            integer[], bigint[], integer[], integer[], real[], integer, integer,
                                            integer[], bigint[], bigint[]);
