-- The pg_net-compatible API for ferry_writer, and what the relay needs of it.
--
-- A writer calls net.http_get/post/delete (which publish through the
-- SECURITY DEFINER ferry.publish) and reads net._http_response, as pg_net
-- users do; it does not read the request queue (other requests' URLs and
-- headers) or the log. The few functions that must look at those to answer a
-- writer (is a request still queued? was it made in this transaction? is a
-- relay up?) run as their owner, with a pinned search_path, and return only
-- a yes/no (their privileges are stated in their files, in functions/).

grant usage on schema net to ferry_writer, ferry_relay;

grant select on net._http_response to ferry_writer;

grant select, insert, update, delete on net._http_response to ferry_relay;

-- Supabase Database Webhooks: the trigger runs as the writer and records each hook.
grant usage on schema supabase_functions to ferry_writer, ferry_relay;

grant insert on supabase_functions.hooks to ferry_writer;

grant usage on sequence supabase_functions.hooks_id_seq to ferry_writer;

grant select on supabase_functions.hooks to ferry_relay;
