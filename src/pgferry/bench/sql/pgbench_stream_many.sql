-- pgbench script: publish_many of {rows} events per transaction across {rows} of 100,000 streams.
\set s random(1, 100000)
select count(*) from {publish_many}(
    array(select 'chat:' || ((:s + g * 7919) % 100000) from generate_series(1, {rows}) g),
    array(select '{"token": "hello"}'::jsonb from generate_series(1, {rows}) g));
