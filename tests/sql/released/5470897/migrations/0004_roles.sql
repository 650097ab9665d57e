-- pgferry 0004: roles and privileges; subscribe validates everything itself.
--
-- Two NOLOGIN group roles, granted to login roles by an administrator:
--
--   ferry_writer  may append events and nothing else: ferry.publish and
--                 ferry.publish_many, the capture triggers on tables it writes,
--                 and (with the pg_net add-on) the net.http_* API. It cannot
--                 read the log, subscriptions (and their signing secrets),
--                 attempts, retries, dead letters or consumers.
--   ferry_relay   what `pgferry run` needs: read and write every ferry table,
--                 truncate rotated partitions, move sequences, call every
--                 function. Also enough for the operator commands (status,
--                 subscription, dlq).
--
-- Roles are cluster-wide, so they are created only when missing: installing
-- into a second database of the same cluster reuses them.
--
-- How writers append without table privileges:
--
-- * publish and publish_many are SECURITY DEFINER (they run as the installer)
--   with search_path pinned to pg_catalog, pg_temp: a caller cannot shadow a
--   function or operator they use, their arguments are plain values (jsonb,
--   text), and they keep the invariants the log depends on (the txid is taken
--   before the partition pointer is read, ids come from the sequence). So a
--   writer needs no privilege on ferry.events at all to publish.
-- * Capture trigger functions stay SECURITY INVOKER on purpose. They turn the
--   writer's rows into JSON (to_jsonb, key columns cast to text), and those
--   conversions call casts that the owner of a column's type may define. Run
--   as the installer, a cast function written by a table owner would run with
--   the installer's rights; run as the writer, it has the writer's. Instead
--   the writer gets INSERT on exactly the columns the triggers fill. The txid,
--   id and created_at columns are not granted, so their defaults always apply
--   and the commit-order machinery cannot be fooled; a writer inserting by
--   hand can only add events to the log, as publish lets it do anyway.
--
-- The functions it defined live in functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

do $$
declare
    v_role text;
begin
    foreach v_role in array array['ferry_writer', 'ferry_relay'] loop
        if not exists (select 1 from pg_roles where rolname = v_role) then
            begin
                execute format('create role %I nologin', v_role);
            exception
                when duplicate_object or unique_violation then
                    null;  -- created at the same moment by an install into another database
                when insufficient_privilege then
                    raise exception 'pgferry: cannot create role %: the installing role needs CREATEROLE', v_role
                        using errcode = '42501',
                              hint = 'Have an administrator run: create role ferry_writer nologin; '
                                     'create role ferry_relay nologin; then run pgferry install again.';
            end;
        end if;
    end loop;
end $$;

---------------------------------------------------------------------------
-- Writers
---------------------------------------------------------------------------

grant usage on schema ferry to ferry_writer;

-- The Python API checks the schema version before publishing.
grant select on ferry.schema_migrations to ferry_writer;

-- Capture triggers (SECURITY INVOKER, see above): the columns they fill, the
-- event id sequence behind the id default, and the partition pointer.
grant insert (part, stream, capture, key, payload, op, old_payload)
    on ferry.events_0, ferry.events_1, ferry.events_2 to ferry_writer;

grant usage on sequence ferry.event_id_seq to ferry_writer;

grant select on sequence ferry.current_partition_seq to ferry_writer;

---------------------------------------------------------------------------
-- The relay (and operators)
---------------------------------------------------------------------------
grant usage on schema ferry to ferry_relay;

grant select, insert, update, delete, truncate on all tables in schema ferry to ferry_relay;

grant usage, select, update on all sequences in schema ferry to ferry_relay;

grant execute on all functions in schema ferry to ferry_relay;

-- Tables and sequences that later migrations (run by the same installer) add.
alter default privileges in schema ferry grant select, insert, update, delete, truncate on tables to ferry_relay;

alter default privileges in schema ferry grant usage, select, update on sequences to ferry_relay;
