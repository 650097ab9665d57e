-- ferry._touch_updated_at() returns trigger
--
-- Settings changed by a plain UPDATE reach the delivering relay too.
--
-- Calls:   -
-- Reads:   -
-- Writes:  -
-- Raises:  -
-- Runs as: the caller (SECURITY INVOKER)
-- Callers: PUBLIC (the default)

create or replace function ferry._touch_updated_at() returns trigger language plpgsql as $$
begin
    new.updated_at := now();
    return new;
end $$;

create or replace trigger subscriptions_touch before update on ferry.subscriptions
    for each row execute function ferry._touch_updated_at();
