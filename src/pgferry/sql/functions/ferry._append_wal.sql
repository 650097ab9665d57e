-- ferry._append_wal(from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz, relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[], lsns bigint[]) returns integer
--
-- ferry._append_wal_v2 with every event under the caller's transaction id,
-- as relays before migration 0028 append: kept for them during an upgrade
-- (docs/operations.md), to be dropped in a later release.
--
-- Calls:   ferry._append_wal_v2
-- Reads:   -
-- Writes:  -
-- Raises:  40001 (ferry._append_wal_v2)
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: the relay (ferry_relay) of the previous release

create or replace function ferry._append_wal(
    from_lsn pg_lsn, to_lsn pg_lsn, committed_at timestamptz,
    relids oid[], ops "char"[], rows jsonb[], olds jsonb[], missing jsonb[], times timestamptz[], lsns bigint[])
returns integer language sql as $$
    select ferry._append_wal_v2(from_lsn, to_lsn, committed_at, relids, ops, rows, olds, missing, times, lsns, null, null)
$$;
