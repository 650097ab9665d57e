-- pgbench script: one transaction writing a trigger-captured table (bench_capture)
-- and a WAL-captured one (bench_wal), a row each, tagged alike (note) so that
-- the bench can pair the two events of a transaction.
\set account random(1, 100000)
\set tag random(1, 2000000000)
begin;
insert into bench_capture (account, amount, note) values (:account, :account * 0.01, :tag);
insert into bench_wal (account, amount, note) values (:account, :account * 0.01, :tag);
commit;
