-- pgbench script: one multi-row INSERT ... SELECT per transaction ({rows} rows
-- into {table}; both are filled in before pgbench sees the file).
\set account random(1, 100000)
insert into {table} (account, amount, note)
select :account + g, (:account + g) * 0.01, 'pgferry bench row' from generate_series(1, {rows}) g;
