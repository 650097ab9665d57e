-- pgferry 0011: capture only some rows, and only some columns.
--
-- Until now ferry.capture_table logged every row of every statement, whole.
-- The first thing teams ask for next is "only paid orders, and never the
-- card_token column": they filtered in the receiver, which means the rows
-- they did not want (and the personal data they must not keep) were written
-- to the log, retained for the rotation interval and sent over the wire.
-- capture_table now takes four options, stored with the capture so that
-- `pgferry status`, operators' SQL and backfills (READ events for existing
-- rows, which must apply the very same choice) can see them:
--
--   condition        a boolean expression over the row's columns, checked
--                    and stored in PostgreSQL's own spelling (deparsed), so
--                    what is shown is what runs; for an UPDATE, the change
--                    is captured when the old OR the new row matches, so a
--                    row leaving the filter is seen leaving it;
--   columns          the columns record/old_record keep (an allow-list: a
--                    column added later is not captured until it is named);
--   exclude_columns  the columns record/old_record drop (a deny-list: a
--                    column added later is captured);
--   changed_columns  an UPDATE is captured only when one of these columns
--                    changed (IS DISTINCT FROM between the old and new row).
--
-- NULL means "not used", and a capture without any of them generates exactly
-- the trigger functions it did before (tests/log/test_capture_filters.py
-- compares them with the text of 0010's), so unfiltered writers pay nothing.
-- Everything is checked when capture_table is called, never on a writer's
-- first insert: ferry._capture_condition (the condition), ferry._check_columns
-- (the column lists); the key and the record a capture builds come from one
-- place each, ferry._key_expression and ferry._record_expression, which
-- backfills call too.
--
-- capture_table gains four parameters with defaults: calls written for 0010
-- (positional or named) keep working, but a new argument list is a new
-- function in PostgreSQL, so the old one is dropped here and the file
-- functions/ferry.capture_table.sql defines the new one. Existing captures
-- keep their generated functions and NULL options (everything, whole).
-- Run capture_table again on a captured table that has a column named r, n
-- or o: the functions generated before took that column for the row (the
-- record was the column r alone; a column n or o failed every UPDATE).

alter table ferry.captures
    add column condition       text,
    add column columns         text[],
    add column exclude_columns text[],
    add column changed_columns text[];

comment on column ferry.captures.condition is
    'pgferry: rows captured (UPDATE: old or new row matches), as PostgreSQL deparsed it; NULL: every row.';
comment on column ferry.captures.columns is
    'pgferry: the only columns record/old_record keep; NULL: all (but exclude_columns).';
comment on column ferry.captures.exclude_columns is
    'pgferry: columns record/old_record leave out; NULL: none.';
comment on column ferry.captures.changed_columns is
    'pgferry: an UPDATE is captured only when one of these changed (IS DISTINCT FROM); NULL: every UPDATE.';

drop function if exists ferry.capture_table(regclass, text, text[], text[]);
