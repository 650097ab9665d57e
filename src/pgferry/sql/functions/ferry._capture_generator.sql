-- ferry._capture_generator() returns integer
--
-- The version of the code ferry.capture_table generates for a trigger
-- capture, written into each generated function's comment ("(generator
-- N)"). Raise it with every change to what capture_table generates: an
-- install regenerates the captures an earlier generator made
-- (ferry._regenerate_trigger_capture), which otherwise kept the code they were
-- made with (a table with a column named r captured before 2026-12-01 went
-- on writing that column's value as the whole record after an upgrade;
-- outside probe). 3: a primary key's INCLUDE columns left out of the
-- default key (migration 0040 corrects the key_columns of captures made
-- before, and their code is generated again with them).
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._capture_generator() returns integer
language sql immutable as $$ select 3 $$;
