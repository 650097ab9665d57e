-- pgferry 0012: a subscription can filter the events it delivers.
--
-- "Only orders over 100", "only tenant acme": without a filter every event
-- of a subscription's streams goes to its endpoint, and the receiver throws
-- most of them away, after pgferry paid for the request, the signature and
-- the attempt row. ferry.subscribe(..., filter => '$.record.amount > 100')
-- keeps such events from ever being sent.
--
-- The filter is a SQL/JSON path predicate, not a SQL expression. It runs in
-- the relay's read of every batch (ferry.webhook_step), as the relay's role.
-- A SQL expression there could call any function that role may call (write,
-- sleep, read other tables), and one that raises on some row (a cast, a
-- division) would make every read of the subscription fail, stalling it for
-- good. A jsonpath cannot call functions or read tables; evaluated with
-- jsonb_path_match_tz(..., silent => true) it turns missing fields, type
-- mismatches and arithmetic errors into "unknown" (not matched) instead of
-- raising; the one error silent mode keeps, a variable the path names but
-- the document lacks, is refused at subscribe (ferry._check_filter). It also
-- needs no dynamic SQL: one statement serves every subscription.
--
-- What the path sees (ferry._filter_match): the payload at $ (the body a
-- receiver gets; for captured rows the Supabase envelope, so '$.type' and
-- '$.record.x' work as written), and the rest of the event as variables:
-- $stream (text), $key (text or null), $headers (object or null).
-- Variables cost one small jsonb per event; wrapping the payload in an
-- object would copy every payload.
--
-- Stored as the text the user wrote (status, the dashboard and apply show
-- and compare exactly that), parsed once per read. The CHECK keeps a direct
-- UPDATE from storing what would fail every read: text that is not a
-- jsonpath (the cast raises) or that names an unknown variable (evaluating
-- it raises, even silently); ferry.subscribe checks more (a predicate) and
-- says why in pgferry's words. Changing a filter applies to the batches the relay reads next: events
-- the cursor already passed are not looked at again.
--
-- ferry.subscribe gains the parameter and ferry.subscription_status a
-- column (filter), so their old signatures go here; functions/ defines the
-- new ones.

alter table ferry.subscriptions
    add column filter text check (
        filter is null
        or coalesce(jsonb_path_exists_tz('{}', filter::jsonpath, '{"stream": "", "key": null, "headers": null}', true),
                    true));

comment on column ferry.subscriptions.filter is
    'pgferry: a jsonpath predicate over the event (payload at $, $stream, $key, $headers); only events '
    'for which it is true are delivered. NULL: every event of the streams.';

drop function if exists ferry.subscribe(text, text[], text, integer, integer, boolean, text, jsonb, integer,
                                        integer, interval, integer, integer, integer, text);

drop function if exists ferry.subscription_status();
