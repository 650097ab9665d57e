-- pgferry 0038: a stream listed twice by a subscription or a consumer is kept once.
--
-- ferry.subscribe and ferry.register_consumer kept a streams array as given:
-- `--stream s --stream s` (or streams = ["s", "t", "s"] in apply) stored
-- {s,s}, and the batch read matched each event of s to the subscription once
-- per listing: every event was delivered twice, in separate requests or
-- twice in one batch's data[] (outside probe). They now keep each stream
-- once, in the order first given; this does the same to what is stored.

update ferry.subscriptions s
set streams = array(select u.s from unnest(s.streams) with ordinality u(s, n) group by u.s order by min(u.n))
where cardinality(s.streams) > (select count(distinct x) from unnest(s.streams) x);

update ferry.consumers c
set streams = array(select u.s from unnest(c.streams) with ordinality u(s, n) group by u.s order by min(u.n))
where c.streams is not null
  and cardinality(c.streams) > (select count(distinct x) from unnest(c.streams) x);
