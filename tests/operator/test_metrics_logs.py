"""Prometheus metrics served by a real relay, and its log output (human, JSON, no secrets)."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from dataclasses import replace

import asyncpg
import orjson

import pgferry
from pgferry.delivery.signing import new_secret
from pgferry.ops.logs import HumanFormatter, JsonFormatter
from pgferry.receiver import Respond
from tests.helpers import FAST, MakeReceiver, RunningRelay, eventually, pgferry_env, scrape, series, value


async def test_relay_serves_delivery_tick_and_database_metrics(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    good, good_url = await receiver_factory()
    _, bad_url = await receiver_factory(lambda _: Respond(503, b"busy"))
    await ferry.subscribe("good", ["s"], good_url, batch_size=2)
    await ferry.subscribe("bad", ["s"], bad_url, max_attempts=1)
    relay = RunningRelay(db_url, replace(FAST, metrics_port=0))
    try:
        await eventually(lambda: bool(relay.relay.addresses.get("metrics")), what="the metrics server")
        url = relay.relay.addresses["metrics"]
        assert url.startswith("http://127.0.0.1:")
        await ferry.publish_many([{"stream": "s", "payload": {"n": n}} for n in range(6)])

        async def delivered() -> bool:
            dead = await conn.fetchval("select count(*) from ferry.dead_letters")
            # An idle subscription's acknowledgements are recorded a moment after its deliveries
            # (with other idle subscriptions', delivery/watch.py): wait for its cursor too.
            behind = await conn.fetchval("select lag_events from ferry.subscription_status() where name = 'good'")
            return bool(len(good.received) == 3 and dead == 6 and behind == 0)  # batch_size 2: 3 requests

        await eventually(delivered, what="deliveries and dead letters")
        samples = await scrape(url)
        assert value(samples, "pgferry_deliveries_total", subscription="good") == 6
        assert value(samples, "pgferry_delivery_failures_total", subscription="bad", error_class="http_status") == 6
        assert value(samples, "pgferry_deliveries_total", subscription="bad") == 0
        assert value(samples, "pgferry_request_duration_seconds_count", subscription="good") == 3  # requests
        assert value(samples, "pgferry_request_duration_seconds_count", subscription="bad") == 6
        assert value(samples, "pgferry_delivery_lag_seconds_count", subscription="good") == 6
        lag_sum = value(samples, "pgferry_delivery_lag_seconds_sum", subscription="good")
        assert 0 < lag_sum < 6 * 10
        assert value(samples, "pgferry_batch_events_count", subscription="good") >= 1
        assert value(samples, "pgferry_batch_events_sum", subscription="good") == 6
        assert value(samples, "pgferry_subscription_dead", subscription="bad") == 6
        assert value(samples, "pgferry_subscription_dead", subscription="good") == 0
        assert value(samples, "pgferry_subscription_parked", subscription="bad") == 0
        assert value(samples, "pgferry_subscription_lag_events", subscription="good") == 0
        assert value(samples, "pgferry_subscription_active", subscription="good", state="active") == 1
        assert value(samples, "pgferry_ticks_total") >= 1
        assert value(samples, "pgferry_db_roundtrip_seconds_count", operation="tick") >= 1
        assert value(samples, "pgferry_db_roundtrip_seconds_count", operation="relay_round") >= 1
        assert value(samples, "pgferry_db_roundtrip_seconds_count", operation="status") == 1
        assert value(samples, "pgferry_relay_is_ticker") == 1
        assert value(samples, "pgferry_relay_owned_subscriptions") == 2

        # Paused: the database gauges follow on the next scrape; removed: its series go, its counters
        # and histograms once a second refresh has not seen it either (subscriptions come and go all day).
        await ferry.pause("good")
        await ferry.unsubscribe("bad")
        await asyncio.sleep(1.05)  # database gauges are refreshed at most once a second
        samples = await scrape(url)
        assert value(samples, "pgferry_subscription_active", subscription="good", state="paused") == 0
        assert ("pgferry_subscription_dead", (("subscription", "bad"),)) not in samples
        await asyncio.sleep(1.05)
        samples = await scrape(url)
        assert not [key for key in samples if ("subscription", "bad") in key[1]], "series of a removed subscription"
        assert value(samples, "pgferry_deliveries_total", subscription="good") == 6
    finally:
        await relay.stop()


async def test_run_logs_json_lines_and_serves_metrics_from_the_command_line(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, receiver_factory: MakeReceiver
) -> None:
    secret = new_secret()
    _, url = await receiver_factory(lambda _: Respond(500, b"nope"))
    await ferry.subscribe("hook", ["s"], url + "?token=query-secret", secret=secret, max_attempts=1)
    await ferry.publish("s", {"n": 1})
    proc = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "run", "--log-format", "json", "--metrics-port", "0", "--exit-after", "4",
        "--metrics-histograms", "relay",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=pgferry_env(db_url),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        metrics_url = None
        while metrics_url is None:
            raw = await asyncio.wait_for(proc.stderr.readline(), 20)
            assert raw, f"relay exited early: {lines}"
            lines.append(raw.decode())
            found = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", lines[-1])
            metrics_url = found[1] if found else None
        samples = await scrape(metrics_url)
        assert ("pgferry_relay_is_ticker", ()) in samples
        for _ in range(20):  # one set of histograms for every subscription, under "(all)"
            requests = series(await scrape(metrics_url), "pgferry_request_duration_seconds_count")
            if requests:
                break
            await asyncio.sleep(0.1)
        assert requests == {(("subscription", "(all)"),): 1.0}
        _, rest = await asyncio.wait_for(proc.communicate(), 30)
        lines += rest.decode().splitlines(keepends=True)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    entries = [orjson.loads(line) for line in lines if line.strip()]
    assert entries and all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)
    text = "".join(lines)
    assert "now delivering subscription hook" in text
    assert secret not in text and "query-secret" not in text


def test_log_formatters_redact_secrets_in_messages_and_tracebacks() -> None:
    secret = new_secret()
    try:
        raise RuntimeError(f"boom with {secret} and postgresql://app:hunter2@db:5432/app")
    except RuntimeError:
        record = logging.LogRecord(
            "pgferry.test", logging.ERROR, __file__, 1, "signing with %s, header Authorization: Bearer %s",
            (secret, "abc.def-ghi"), exc_info=sys.exc_info(),
        )  # fmt: skip
    for formatter in (HumanFormatter(), JsonFormatter()):
        out = formatter.format(record)
        assert secret not in out and "hunter2" not in out and "abc.def-ghi" not in out, out
        assert "whsec_***" in out and "postgresql://app:***@db:5432/app" in out and "Bearer ***" in out
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["level"] == "error" and entry["logger"] == "pgferry.test" and "RuntimeError" in entry["exc"]
