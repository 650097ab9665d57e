-- ferry._capture_function(tbl regclass) returns text
-- ferry._capture_function(tbl regclass, operation text) returns text
--
-- Name of the capture trigger function generated for a table.
--
-- The name of the trigger function generated for one operation on a table.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._capture_function(tbl regclass) returns text
language sql stable as $$ select format('ferry._capture_%s', tbl::oid) $$;

create or replace function ferry._capture_function(tbl regclass, operation text) returns text
language sql immutable as $$ select format('ferry._capture_%s_%s', tbl::oid, operation) $$;
