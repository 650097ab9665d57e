-- Supabase "Database Webhooks" on pgferry: the trigger function Supabase
-- Studio attaches to tables, with the same arguments and payload, so hooks
-- created in a Supabase project run unchanged (and durably).
--
-- The functions it defined live in addons/pg_net/functions/, one file each with its
-- current definition, applied by every `pgferry install` after the migrations.

create schema if not exists supabase_functions;

create table if not exists supabase_functions.migrations (
    version     text        primary key,
    inserted_at timestamptz not null default now()
);

create table if not exists supabase_functions.hooks (
    id            bigserial   primary key,
    hook_table_id integer     not null,
    hook_name     text        not null,
    created_at    timestamptz not null default now(),
    request_id    bigint
);

create index if not exists supabase_functions_hooks_request_id_idx on supabase_functions.hooks (request_id);

create index if not exists supabase_functions_hooks_h_table_id_h_name_idx
    on supabase_functions.hooks (hook_table_id, hook_name);

comment on table supabase_functions.hooks is 'Supabase Functions Hooks: Audit trail for triggered hooks.';
