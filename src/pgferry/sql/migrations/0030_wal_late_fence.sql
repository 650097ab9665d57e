-- pgferry 0030: a round of WAL capture that moves changes to its own
-- transaction (a tick already saw their source transaction committed: they
-- come in a later batch) says so here, and the relay's ticker takes its
-- fence again when the fence does not see that round committed. Recorded
-- as it was, such a fence saw a later source transaction committed but not
-- the round: the later change (stored under its own transaction) came in an
-- earlier batch than the one moved, out of commit order for their key
-- (found from outside by killing the relay under writers; ferry._tick_fenced,
-- ferry._append_wal_v2).

alter table ferry.wal_slot add column late_txid xid8;
comment on column ferry.wal_slot.late_txid is
    'The last transaction of WAL capture that moved changes to a later batch; a tick''s fence must see it committed.';
