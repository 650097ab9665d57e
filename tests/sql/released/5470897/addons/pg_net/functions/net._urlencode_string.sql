-- net._urlencode_string(string varchar) returns text
--
-- URL building, as pg_net does it: each param key and value percent-encoded
-- (everything but A-Z a-z 0-9 - . _ ~), appended to the query string.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function net._urlencode_string(string varchar) returns text
language sql immutable parallel safe as $$
    select string_agg(
        case when b between 48 and 57 or b between 65 and 90 or b between 97 and 122 or b in (45, 46, 95, 126)
             then chr(b) else '%' || upper(lpad(to_hex(b), 2, '0')) end, '' order by i)
    from (select get_byte(bytes, i) as b, i
          from (select convert_to(string, 'UTF8') as bytes) s,
               generate_series(0, length(convert_to(string, 'UTF8')) - 1) as i) x
$$;
