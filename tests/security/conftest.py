"""Fixtures for the security tests: real PostgreSQL, relays and receivers on 127.0.0.1 only."""

from __future__ import annotations

from tests.pg_net.conftest import net_conn, net_db, net_relay  # noqa: F401 - fixture re-export
