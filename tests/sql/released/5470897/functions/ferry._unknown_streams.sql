-- ferry._unknown_streams(streams text[]) returns text[]
--
-- Which of the given streams nothing has written yet: no current capture
-- writes it, it is not 'net.http' with the pg_net add-on installed, and
-- neither ferry.streams nor the events committed since the catalogued
-- snapshot hold it (see the header of this migration for why this is cheap
-- and sound).
--
-- Parameters: streams  stream names (NULLs and repeats are ignored).
-- Returns:    those unknown, each once, in the order given; '{}' for none.
-- Calls:      nothing.
-- Tables:     reads ferry.streams, ferry.stream_scan, ferry.captures,
--             ferry.addon_migrations, ferry.events.
-- Raises:     nothing of its own (42501 without privileges on those tables).
-- Roles:      ferry_relay (ferry.subscribe, `pgferry status`,
--             `pgferry subscription add`, `pgferry apply`).

create or replace function ferry._unknown_streams(streams text[]) returns text[]
language plpgsql stable as $$
declare
    v_scanned pg_snapshot;
    v_pg_net  boolean;
    v_unknown text[];
begin
    select p.scanned_to into v_scanned from ferry.stream_scan p;
    -- PL/pgSQL, not SQL: install creates ferry.addon_migrations after the core migrations.
    v_pg_net := exists (select 1 from ferry.addon_migrations a where a.addon = 'pg_net');
    select coalesce(array_agg(u.stream order by u.ord), '{}') into v_unknown
    from (select s.stream, min(s.ord) as ord
          from unnest(_unknown_streams.streams) with ordinality as s(stream, ord)
          where s.stream is not null group by s.stream) u
    where not exists (select 1 from ferry.streams k where k.stream = u.stream)
      and not exists (select 1 from ferry.captures c where c.stream = u.stream and c.uncaptured_at is null)
      and not (u.stream = 'net.http' and v_pg_net)
      and not exists (select 1 from ferry.events e
                      where e.stream = u.stream
                        and e.txid >= pg_snapshot_xmax(v_scanned)
                        and e.txid < pg_snapshot_xmax(pg_current_snapshot()))
      and not exists (select 1 from ferry.events e
                      where e.stream = u.stream
                        and e.txid = any (array(select pg_snapshot_xip(v_scanned)))
                        and e.txid >= pg_snapshot_xmin(v_scanned) and e.txid < pg_snapshot_xmax(v_scanned));
    return v_unknown;
end $$;

grant execute on function ferry._unknown_streams(text[]) to ferry_relay;
