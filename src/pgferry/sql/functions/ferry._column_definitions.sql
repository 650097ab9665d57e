-- ferry._column_definitions(tbl oid) returns text
--
-- A table's columns as a column definition list for jsonb_to_record
-- ("id" integer, "amount" numeric(10,2), ...), in column order, with each
-- domain (and array of a domain) replaced by its base type; NULL when no
-- table has that oid (dropped). WAL capture (ferry._append_wal_v2) types a
-- decoded row with it to evaluate a capture's condition and changed_columns
-- and to write values as to_jsonb does. jsonb_populate_record over the
-- table's own row type also checks each domain, and a change decoded after
-- the table changed can fail that check though its row was valid when
-- written: a NOT NULL domain column added after the row (absent from it,
-- so null), or a constraint added NOT VALID. Failing the append holds WAL
-- capture of every table (outside probe); to_jsonb writes a domain's value
-- as its base type's, so the record is the same.
-- Each column keeps its collation (COLLATE, when it is not its type's):
-- without it the condition, changed_columns and generated columns were
-- evaluated under the database's default, where triggers use the column's
-- ("name < 'b'" under de-x-icu, a case-insensitive email, lower() under
-- tr-x-icu), and WAL capture lost events and wrote others (outside probe).
--
-- Calls:   -
-- Reads:   pg_attribute, pg_collation, pg_namespace, pg_type
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._column_definitions(tbl oid) returns text
language sql stable as $$
    select string_agg(format('%I %s', a.attname, format_type(b.typid, b.typmod))
                      || coalesce(' collate ' || (select format('%I.%I', cn.nspname, co.collname)
                                                  from pg_collation co join pg_namespace cn on cn.oid = co.collnamespace
                                                  where co.oid = a.attcollation
                                                    and a.attcollation <> (select bt.typcollation from pg_type bt
                                                                           where bt.oid = b.typid)), ''),
                      ', ' order by a.attnum)
    from pg_attribute a
    join pg_type t on t.oid = a.atttypid
    left join pg_type e on e.oid = t.typelem and t.typcategory = 'A' and e.typtype = 'd'  -- an array of a domain
    cross join lateral (
        -- Down the chain of domains to the base type (of the array's element, then its array).
        with recursive d(typid, typmod, depth) as (
            select coalesce(e.oid, a.atttypid), a.atttypmod, 0
            union all
            select dt.typbasetype, dt.typtypmod, d.depth + 1
            from d join pg_type dt on dt.oid = d.typid
            where dt.typtype = 'd')
        select case when e.oid is null then d.typid else (select bt.typarray from pg_type bt where bt.oid = d.typid) end
                   as typid,
               d.typmod
        from d order by d.depth desc limit 1) b
    where a.attrelid = tbl and a.attnum > 0 and not a.attisdropped
$$;
