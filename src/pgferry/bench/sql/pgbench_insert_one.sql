-- pgbench script: one single-row INSERT per transaction. {table} is filled in.
\set account random(1, 100000)
insert into {table} (account, amount, note) values (:account, :account * 0.01, 'pgferry bench row');
