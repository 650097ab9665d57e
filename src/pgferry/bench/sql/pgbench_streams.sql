-- `pgferry bench streams`: one event per transaction to one of {streams} streams named {prefix}0, {prefix}1, ...
-- The payload's t is the wall clock (seconds) taken inside the statement, just before its COMMIT.
\set s random(0, {streams} - 1)
select ferry.publish('{prefix}' || :s, jsonb_build_object('t', extract(epoch from clock_timestamp()), 'text', 'a token of an answer, streamed to its reader'));
