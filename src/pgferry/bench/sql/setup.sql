-- Tables and triggers of `pgferry bench capture`, created in a scratch database.
--
-- Every insert variant gets its own table with the same columns and its own
-- sequence, so the variants never contend on each other's pages or locks.

-- (plain) no trigger at all: the ceiling every variant is measured against.
create table bench_plain (
    id      bigserial primary key,
    account integer not null,
    amount  numeric not null,
    note    text    not null
);

-- (a) ferry.capture_table: pgferry's statement-level trigger (installed below).
create table bench_capture (
    id      bigserial primary key,
    account integer not null,
    amount  numeric not null,
    note    text    not null
);

-- (a') ferry.capture_table with a condition every row meets and a column
-- list (bench capture --filtered): as many events as (a), smaller records.
create table bench_filtered (
    id      bigserial primary key,
    account integer not null,
    amount  numeric not null,
    note    text    not null
);

-- (b) the classic transactional outbox: a per-row trigger writes one row.
create table bench_outbox (
    id      bigserial primary key,
    account integer not null,
    amount  numeric not null,
    note    text    not null
);

create table bench_outbox_events (
    id         bigserial   primary key,
    payload    jsonb       not null,
    created_at timestamptz not null default now()
);

create function bench_outbox_row() returns trigger
language plpgsql as $$
begin
    insert into bench_outbox_events (payload) values (to_jsonb(new));
    return null;
end $$;

create trigger bench_outbox_row after insert on bench_outbox
    for each row execute function bench_outbox_row();

-- (c) the per-row NOTIFY failure mode: the row goes out as a notification and
-- is written nowhere else.
create table bench_notify (
    id      bigserial primary key,
    account integer not null,
    amount  numeric not null,
    note    text    not null
);

create function bench_notify_row() returns trigger
language plpgsql as $$
begin
    perform pg_notify('bench', to_jsonb(new)::text);
    return null;
end $$;

create trigger bench_notify_row after insert on bench_notify
    for each row execute function bench_notify_row();

-- End-to-end latency: each row carries the time it was written.
create table bench_e2e (
    id      bigserial   primary key,
    account integer     not null,
    amount  numeric     not null,
    note    text        not null,
    sent_at timestamptz not null default clock_timestamp()
);

select ferry.capture_table('public.bench_capture', stream => 'bench.capture', operations => array['insert']);
select ferry.capture_table('public.bench_filtered', stream => 'bench.filtered', operations => array['insert'],
                           condition => 'amount >= 0', columns => array['id', 'account', 'amount']);
select ferry.capture_table('public.bench_e2e', stream => 'bench.e2e', operations => array['insert']);
