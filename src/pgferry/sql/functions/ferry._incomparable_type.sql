-- ferry._incomparable_type(typ oid, top boolean default true) returns regtype
--
-- The type, typ or one inside it, whose values an UPDATE's comparison of a
-- changed_columns column (IS DISTINCT FROM, its `=`) cannot compare, or
-- NULL. The `=` of an array or a composite resolves when a statement is
-- planned but finds the equality of its elements' or fields' types only on
-- values: json[], xml[], point[] or a composite holding json passed
-- capture_table's check (planned over NULLs), then every UPDATE of the
-- table failed, or WAL capture of every table was held ("could not identify
-- an equality operator for type json"; outside probe). Values inside an
-- array or a composite are compared as PostgreSQL's type cache does: by the
-- default btree, else hash, operator class of their type (a domain's base
-- type's; an enum, a range or a multirange always has one), recursively
-- through arrays and composites. top: typ is the column's own type, whose
-- `=` capture_table resolves by planning (a box's compares areas, but
-- exists): only what is inside an array or a composite is looked up here.
--
-- Calls:   ferry._incomparable_type (recursively)
-- Reads:   pg_type, pg_attribute, pg_opclass, pg_am, pg_cast
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._incomparable_type(typ oid, top boolean default true) returns regtype
language plpgsql stable as $$
declare
    t   pg_type;
    v_f oid;
    v_r regtype;
begin
    select * into t from pg_type where oid = typ;
    if not found then
        return null;
    end if;
    if t.typtype = 'd' then
        return ferry._incomparable_type(t.typbasetype, top);
    end if;
    if t.typelem <> 0 and t.typsubscript = 'array_subscript_handler'::regproc and t.typlen = -1 then
        return ferry._incomparable_type(t.typelem, false);
    end if;
    if t.typtype = 'c' then
        for v_f in select a.atttypid from pg_attribute a
                   where a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped order by a.attnum loop
            v_r := ferry._incomparable_type(v_f, false);
            if v_r is not null then
                return v_r;
            end if;
        end loop;
        return null;
    end if;
    if top or t.typtype in ('e', 'r', 'm') then
        return null;
    end if;
    if exists (select 1 from pg_opclass o join pg_am am on am.oid = o.opcmethod
               where o.opcdefault and am.amname in ('btree', 'hash')
                 and (o.opcintype = typ
                      or exists (select 1 from pg_cast c where c.castsource = typ and c.casttarget = o.opcintype
                                                           and c.castmethod = 'b' and c.castcontext = 'i'))) then
        return null;
    end if;
    return typ::regtype;
end $$;
