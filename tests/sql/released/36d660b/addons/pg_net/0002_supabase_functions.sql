-- Supabase "Database Webhooks" on pgferry: the trigger function Supabase
-- Studio attaches to tables, with the same arguments and payload, so hooks
-- created in a Supabase project run unchanged (and durably).

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

-- Row-level trigger. Arguments: url, method ('GET' or 'POST'), headers,
-- params, timeout_ms; a missing argument or the text 'null' takes the default.
create or replace function supabase_functions.http_request() returns trigger
language plpgsql as $$
declare
    v_url text := case when TG_NARGS > 0 and TG_ARGV[0] <> 'null' then TG_ARGV[0] end;
    v_method text := case when TG_NARGS > 1 and TG_ARGV[1] <> 'null' then TG_ARGV[1] end;
    v_headers jsonb := case when TG_NARGS > 2 and TG_ARGV[2] <> 'null' then TG_ARGV[2]::jsonb
                            else '{"Content-Type": "application/json"}'::jsonb end;
    v_params jsonb := case when TG_NARGS > 3 and TG_ARGV[3] <> 'null' then TG_ARGV[3]::jsonb else '{}'::jsonb end;
    v_timeout integer := case when TG_NARGS > 4 and TG_ARGV[4] <> 'null' then TG_ARGV[4]::integer else 1000 end;
    v_request_id bigint;
    v_payload jsonb;
begin
    if v_url is null then
        raise exception 'url argument is missing';
    end if;
    if v_method is null then
        raise exception 'method argument is missing';
    end if;
    if v_method = 'GET' then
        v_request_id := net.http_get(v_url, v_params, v_headers, v_timeout);
    elsif v_method = 'POST' then
        v_payload := jsonb_build_object(
            'old_record', case when TG_OP in ('UPDATE', 'DELETE') then to_jsonb(OLD) end,
            'record', case when TG_OP in ('INSERT', 'UPDATE') then to_jsonb(NEW) end,
            'type', TG_OP,
            'table', TG_TABLE_NAME,
            'schema', TG_TABLE_SCHEMA);
        v_request_id := net.http_post(v_url, v_payload, v_params, v_headers, v_timeout);
    else
        raise exception 'method argument % is invalid', v_method;
    end if;
    insert into supabase_functions.hooks (hook_table_id, hook_name, request_id)
    values (TG_RELID, TG_NAME, v_request_id);
    return NEW;
end $$;
