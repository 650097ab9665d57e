-- Named queries of `pgferry bench webhooks`. Each starts with "-- name: NAME".

-- name: setup
create table if not exists spice_harvests (
    id           bigserial   primary key,
    harvester    text        not null,
    amount       integer     not null,
    harvested_at timestamptz not null default clock_timestamp()
);
select ferry.capture_table('spice_harvests');

-- name: reset
truncate spice_harvests;
delete from ferry.subscriptions where kind = 'webhook';
delete from ferry.consumers where name <> 'webhook:pg_net';
truncate ferry.events, ferry.attempts, ferry.deliveries, ferry.retries, ferry.dead_letters;

-- name: subscribe
select ferry.subscribe('bench', array['public.spice_harvests'], $1, batch_size => $2, max_in_flight => $3,
                       retry_base_ms => 100, retry_max_ms => 2000, max_attempts => 1000, partitions => $4)

-- name: pause
select ferry.pause_subscription('bench')

-- name: resume
select ferry.resume_subscription('bench')

-- name: checkpoint
checkpoint

-- name: rows
select count(*) from spice_harvests

-- name: dead
select count(*) from ferry.dead_letters

-- name: failed_attempts
select count(*) from ferry.attempts where error_class is not null

-- name: failure_classes
select error_class, count(*) as n from ferry.attempts where error_class is not null group by 1 order by 2 desc

-- name: setup_pg_net
-- The seed's trigger from a pg_net tutorial, unchanged but for the URL.
create table if not exists spice_harvests_net (
    id           bigserial   primary key,
    harvester    text        not null,
    amount       integer     not null,
    harvested_at timestamptz not null default clock_timestamp()
);
create or replace function spice_harvests_webhook() returns trigger language plpgsql as $f$
begin
  perform net.http_post(url := {hook_url}, body := to_jsonb(NEW),
                        headers := '{"Content-Type": "application/json"}'::jsonb);
  return NEW;
end $f$;
drop trigger if exists spice_harvests_webhook on spice_harvests_net;
create trigger spice_harvests_webhook after insert on spice_harvests_net
  for each row execute function spice_harvests_webhook();

-- name: reset_pg_net
truncate spice_harvests_net, net._http_response, ferry.events, ferry.attempts, ferry.deliveries, ferry.retries,
    ferry.dead_letters;
update ferry.subscriptions set retry_base_ms = 100, retry_max_ms = 2000, max_attempts = 1000 where name = 'pg_net';

-- name: net_responses
select count(*) filter (where status_code = 200) as ok, count(*) as total,
       extract(epoch from max(created)) as last_at
from net._http_response
