"""`pgferry bench streams`: the durable-streams HTTP API under fan-out, publishing, catch-up and a connect storm.

Issue 13's targets, on one relay on a two-core machine: 1,000 SSE clients
each following its own stream while 2,000 events/s are published across
them, every event received, commit-to-client p50 ≤ 15 ms and p99 ≤ 100 ms,
and database queries per second that do not grow with the clients;
``Ferry.publish()`` at ≥ 5,000 events/s while they read; one reader catching
up on a 1,000,000-event stream at ≥ 100,000 events/s over SSE; 10,000
clients connecting at once without the relay stopping serving or its memory
running away.

Every party is a process of its own, as in production, so that none starves
another unseen and each one's CPU can be read from /proc (``bench.procstat``):
the relay is `pgferry run --api-port P --api-allow-loopback` (``bench.relay``,
a fresh one per scenario run); the clients are ``sse_client`` here (raw
sockets, many per process); the fan-out's writer is pgbench running
``ferry.publish`` in SQL, the publish scenario's is ``writer`` here
(``Ferry.publish`` from 16 tasks); writers log in as a role of their own so
that their statements are told from the relay's. The bench process only
starts them and reads counters.

Modules: ``common`` (settings, the processes, the database's counters),
``fanout`` (1 and 2), ``catchup`` (3), ``storm`` (4), ``versus_dbos`` (5, with
``dbos_side``, run by a Python that has dbos), ``run`` (the command), and the
processes ``sse_client``, ``writer`` and ``pyreader``.

What is measured, and how:

- Latency: each fan-out payload carries ``t``, the server's wall clock taken
  with ``clock_timestamp()`` inside the publishing statement, just before its
  COMMIT (so the commit's WAL flush is inside the latency); the client notes
  the wall clock when the event's bytes arrive. Same machine, same clock.
  The publish scenario stamps ``t`` in Python just before each call.
- Loss: every stream is closed after the load (``ferry.close_stream``); a
  client ends at its stream's ``end`` event. Events committed per stream are
  counted in the database, events received per connection by the client;
  a repeated or backwards offset counts as a duplicate.
- Queries/s: ``pg_stat_statements`` calls in the bench database over the
  load window, less the writers' role's: what the relay (ticker, hub, API,
  housekeeping) asks of the database, and how long those statements ran.
  Without pg_stat_statements: transactions (``pg_stat_database``) less the
  writer's.
- CPU: user + system seconds of each process over the window, 100% = one core;
  PostgreSQL is the postmaster and all its backends.
"""
