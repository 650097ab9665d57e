-- supabase_functions.http_request() returns trigger
--
-- Row-level trigger. Arguments: url, method ('GET' or 'POST'), headers,
-- params, timeout_ms; a missing argument or the text 'null' takes the default.
--
-- Calls:   net.http_get, net.http_post
-- Reads:   -
-- Writes:  supabase_functions.hooks
-- Raises:  22004, 22023, 23502, P0001
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

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
