-- pgferry 0019: message broker sinks. A subscription whose URL is
-- nats://host:4222/<subject> publishes to NATS JetStream, one whose URL is
-- redis://host:6379/<db>?stream=<name> appends to Redis Streams
-- (ferry._check_url, delivery/sink.py). A broker's credentials never go in
-- the URL, which status and logs show: they are kept here, set with
-- ferry.set_subscription_credentials, and read by the relay only, like
-- signing secrets.

alter table ferry.subscriptions add column credentials jsonb not null default '{}'
    check (jsonb_typeof(credentials) = 'object');
comment on column ferry.subscriptions.credentials is
    'A broker''s credentials (user and password, token, or a NATS creds_file path); never shown by status.';
