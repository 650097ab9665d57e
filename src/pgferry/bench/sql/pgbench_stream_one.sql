-- pgbench script: one event per transaction to one of 100,000 streams. {publish} is filled in.
\set s random(1, 100000)
select {publish}('chat:' || :s, '{"token": "hello"}');
