-- pgferry 0009: bearer tokens for the streams HTTP API.
--
-- `pgferry run --api-port` serves durable streams over HTTP (Server-Sent
-- Events, a JSON long-poll, publishing). Every request carries a bearer
-- token, and ferry.api_tokens says what each token may do: read the streams
-- whose names match one of its read patterns, publish to those matching one
-- of its write patterns (glob-like: `*` any run of characters, `?` one
-- character, the rest literal; `*` alone is every stream).
--
-- What is stored is the token's SHA-256, never the token. A token is
-- `pft_` followed by 32 random bytes (secrets.token_urlsafe, URL-safe
-- base64), made in Python and shown once. That is 256 bits of entropy, not a
-- password someone chose: a slow, salted KDF (bcrypt, scrypt, argon2) exists
-- to make guessing a low-entropy secret from its hash expensive, and nobody
-- can enumerate 2^256 candidates however fast the hash is. A salt would only
-- stop precomputed tables, which cannot exist for such inputs either. A slow
-- KDF would, on the other hand, cost every API request tens of milliseconds
-- of CPU and turn a flood of bogus tokens into a denial of service. So a
-- plain SHA-256 is enough, and a hash from a stolen backup or a read of this
-- table gives nobody a usable token. The relay finds a token by its hash and
-- confirms the match with a constant-time comparison (hmac.compare_digest),
-- so response times say nothing about how close a guess was.
--
-- Rows are never deleted by pgferry: revoking sets revoked_at, which keeps
-- the record of who had access (name, patterns, creation, last use). A name
-- is unique among the tokens not revoked, so the name of a revoked token can
-- be given to its replacement (`pgferry token create NAME` after `revoke`),
-- and `pgferry token revoke NAME` always means exactly one live token.
--
-- last_used_at is written by the relay, rarely: it notes which tokens it saw
-- used and marks them on its next refresh of the table, at most once a minute
-- per token (the refresh query itself does it, so it costs no extra round
-- trip). It answers "is this token still in use?" before a revoke, to the
-- minute, without a write per request.
--
-- Privileges: creating and revoking tokens is for the role that installed
-- pgferry (or one it grants INSERT and UPDATE to), never for ferry_relay,
-- which may read the tokens and mark when they were used, and nothing more;
-- a relay's credentials cannot mint tokens or bring a revoked one back.
-- ferry_writer gets nothing. The functions are in functions/
-- (ferry.token_create, ferry.token_revoke, ferry._check_token_patterns).

create table ferry.api_tokens (
    id              bigint      generated always as identity primary key,
    name            text        not null check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$'),
    token_hash      bytea       not null unique check (octet_length(token_hash) = 32),
    read_patterns   text[]      not null default '{}',
    write_patterns  text[]      not null default '{}',
    created_at      timestamptz not null default now(),
    created_by      text        not null default current_user,
    last_used_at    timestamptz,
    revoked_at      timestamptz
);

comment on table ferry.api_tokens is
    'pgferry: bearer tokens of the streams HTTP API, by SHA-256 of the token (never the token); see migration 0009.';

-- One live token per name; the relay loads the live ones (a handful of rows: no index needed for that).
create unique index api_tokens_live_name_idx on ferry.api_tokens (name) where revoked_at is null;

---------------------------------------------------------------------------
-- Privileges. ALTER DEFAULT PRIVILEGES (0004) gave ferry_relay everything on
-- the new table and its sequence; it keeps reading, and writing last_used_at.
---------------------------------------------------------------------------

revoke all on ferry.api_tokens from ferry_relay;

grant select, update (last_used_at) on ferry.api_tokens to ferry_relay;

revoke all on sequence ferry.api_tokens_id_seq from ferry_relay;
