-- pgferry 0031: a relay claims the consumers of one ownership round in one
-- statement (ferry._claim_consumers): three round trips per consumer made a
-- relay starting with 5,000 subscriptions take a minute to claim them. The
-- one-at-a-time claim goes.

drop function if exists ferry._claim_consumer(text);
