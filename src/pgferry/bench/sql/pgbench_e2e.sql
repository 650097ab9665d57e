-- pgbench script: a single-row INSERT into the captured table; the row carries
-- the time it was written, so the reader can tell how long it took to arrive.
\set account random(1, 100000)
insert into bench_e2e (account, amount, note, sent_at) values (:account, :account * 0.01, 'e2e', clock_timestamp());
