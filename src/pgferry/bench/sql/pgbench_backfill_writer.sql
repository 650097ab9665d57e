-- pgbench script: one single-row UPDATE of a random row of the table being backfilled, per transaction.
\set id random(1, {rows})
update bench_orders set amount = amount + 1, updated_at = now() where id = :id;
