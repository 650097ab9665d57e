"""The relay's web dashboard: access control over HTTP, and end to end in headless Chromium."""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import replace
from pathlib import Path

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp import web

import pgferry
from pgferry import db
from pgferry.embedded import EmbeddedPostgres
from pgferry.errors import PgferryError
from pgferry.ops.dashboard import Dashboard
from pgferry.ops.logs import PoolFloorWarnings
from pgferry.receiver import Received, Respond
from pgferry.relay.process import Relay
from pgferry.relay.surface import check_dashboard_binding
from tests.faults.proxy import FaultProxy
from tests.helpers import CHROMIUM, CHROMIUM_ARGS, FAST, MakeReceiver, RunningRelay, eventually
from tests.operator.conftest import cli


async def _started(relay: RunningRelay) -> str:
    async def up() -> bool:
        return "dashboard" in relay.relay.addresses

    await eventually(up, what="the dashboard to listen")
    return relay.relay.addresses["dashboard"]


async def test_dashboard_needs_a_token_off_loopback_and_checks_token_host_and_form(
    pgferry_cmd: list[str], db_url: str, ferry: pgferry.Ferry, conn: asyncpg.Connection
) -> None:
    with pytest.raises(PgferryError, match="give --dashboard-token"):
        check_dashboard_binding("0.0.0.0", None)
    with pytest.raises(PgferryError):
        Relay(db_url, replace(FAST, dashboard_port=0, dashboard_host="0.0.0.0"))
    refused = await cli(pgferry_cmd, db_url, "run", "--dashboard-port", "0", "--dashboard-host", "0.0.0.0")
    assert refused.returncode == 2 and "give --dashboard-token" in refused.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = await cli(pgferry_cmd, db_url, "run", "--dashboard-port", port, "--exit-after", "10")
    assert busy.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr, busy.stderr
    assert "Traceback" not in busy.stderr and "never awaited" not in busy.stderr

    await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x")
    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0, dashboard_token="let-me-in"))
    try:
        base = await _started(relay)
        # unsafe: keep cookies of an IP-address host, as browsers do
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            async with session.get(base) as r:
                assert r.status == 401 and "token required" in await r.text()
            async with session.get(base, headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with session.get(base + "?token=let-me-in") as r:  # sets the cookie, then redirects
                assert r.status == 200 and 'data-subscription="hook"' in await r.text()
            async with session.get(base) as r:  # the cookie is enough now
                assert r.status == 200
            async with session.get(base + "?flash=crafted") as r:  # messages only by key, never from the link
                assert r.status == 200 and 'class="flash"' not in await r.text()
            async with session.post(base + "subscriptions/hook/pause", data={"csrf": "forged"}) as r:
                assert r.status == 403
            assert await conn.fetchval("select state from ferry.subscriptions") == "active"
            rebinding = base.replace("127.0.0.1", "localhost")
            async with session.get(rebinding, headers={"Host": "evil.example"}) as r:
                assert r.status == 403
        async with (
            aiohttp.ClientSession() as fresh,
            fresh.get(base, headers={"Authorization": "Bearer let-me-in"}) as r,
        ):
            assert r.status == 200
    finally:
        await relay.stop()


async def test_a_dashboard_on_another_loopback_address_answers_to_it_and_refuses_other_names(db_url: str) -> None:
    """Outside probe: bound to 127.0.0.2 (loopback, so no token needed) it answered its own address
    with "403 this dashboard answers only to loopback host names": only 127.0.0.1 was listed."""
    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0, dashboard_host="127.0.0.2"))
    try:
        base = await _started(relay)
        assert base.startswith("http://127.0.0.2:"), base
        async with aiohttp.ClientSession() as session:
            async with session.get(base) as r:
                assert r.status == 200, await r.text()
            for host in ("evil.example", "127.0.0.2.nip.io", "10.0.0.1"):
                async with session.get(base, headers={"Host": host}) as r:
                    assert r.status == 403, host
    finally:
        await relay.stop()


async def test_the_overview_shows_a_page_of_subscriptions_filtered_and_keeps_it_after_a_button(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await conn.execute(
        "select ferry.subscribe(format('hook-%s', lpad(g::text, 3, '0')), array['s'], 'http://127.0.0.1:9/x')"
        " from generate_series(1, 250) g"
    )
    await conn.execute("update ferry.subscriptions set state = 'paused' where name in ('hook-007', 'hook-201')")
    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0))

    def names(text: str) -> list[str]:
        return re.findall(r'data-subscription="([^"]+)"', text)

    try:
        base = (await _started(relay)).rstrip("/")
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/") as r:
                text = await r.text()
            assert names(text) == [f"hook-{n:03d}" for n in range(1, 101)]
            assert "250 subscription(s)" in text and "1-100 of 250 shown" in text and "page 1 of 3" in text
            async with session.get(base + "/?page=3") as r:
                assert names(await r.text()) == [f"hook-{n:03d}" for n in range(201, 251)]
            async with session.get(base + "/?q=HOOK-02") as r:  # any case, any part of the name
                assert names(await r.text()) == [f"hook-{n:03d}" for n in range(20, 30)]
            async with session.get(base + "/?attention=1") as r:
                text = await r.text()
            assert names(text) == ["hook-007", "hook-201"] and "2 need attention" in text
            async with session.get(base + "/?page=abc") as r:  # a bad page number is the first page
                assert r.status == 200 and names(await r.text())[0] == "hook-001"

            # A button on page 2 brings the operator back to page 2, with the message.
            async with session.get(base + "/?page=2") as r:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text())
            assert csrf is not None
            form = {"csrf": csrf[1], "back": "/?page=2&flash=old"}
            async with session.post(base + "/subscriptions/hook-150/pause", data=form) as r:
                text = await r.text()
            assert "hook-150 paused" in text and names(text)[0] == "hook-101"
            assert await conn.fetchval("select state from ferry.subscriptions where name = 'hook-150'") == "paused"
    finally:
        await relay.stop()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it as root)")
async def test_dashboard_in_chromium_shows_a_failing_subscription_and_replays_it(
    db_url: str,
    conn: asyncpg.Connection,
    ferry: pgferry.Ferry,
    receiver_factory: MakeReceiver,
    tmp_path: Path,
) -> None:
    from playwright.async_api import async_playwright, expect

    healthy = False

    def behaviour(_: Received) -> Respond:
        return Respond() if healthy else Respond(500, b"receiver says: <b>out of disk</b>")

    receiver, url = await receiver_factory(behaviour)
    await ferry.subscribe("billing", ["orders"], url, max_attempts=1)
    ids = await ferry.publish_many([{"stream": "orders", "payload": {"order": n}} for n in range(3)])

    async def dead() -> bool:
        return bool(await conn.fetchval("select count(*) from ferry.dead_letters") == 3)

    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0))
    try:
        base = await _started(relay)
        await eventually(dead, what="three dead letters")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await browser.new_page()
                await page.goto(base)
                row = page.locator('tr[data-subscription="billing"]')
                await expect(row.locator(".health")).to_contain_text("failing: HTTP 500", timeout=15000)
                await expect(row.locator(".dead")).to_have_text("3")
                # The receiver's answer is shown as text, never as markup.
                await expect(page.locator("tr.failure").first).to_contain_text("receiver says: <b>out of disk</b>")
                await page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

                healthy = True
                await row.locator('button[data-action="replay-dead"]').click()
                await expect(page.locator(".flash")).to_contain_text("3 dead letter(s) of billing queued")

                async def arrived() -> bool:
                    return len(receiver.received) == 3

                await eventually(arrived, what="the replayed events at the receiver")
                assert sorted(r.headers["webhook-id"] for r in receiver.received) == sorted(f"evt_{i}" for i in ids)
                await expect(page.locator('tr[data-subscription="billing"] .health')).to_have_text("ok", timeout=15000)

                # The event's trace page: delivered, with the failed attempt and the successful one.
                await page.fill('input[name="id"]', str(ids[0]))
                await page.click('form[action="/events"] button')
                await page.wait_for_url(f"**/events/{ids[0]}")
                await expect(page.locator('tr[data-subscription="billing"]')).to_contain_text("delivered")
                await expect(page.locator("main")).to_contain_text("out of disk")
                await page.screenshot(path=str(tmp_path / "trace.png"), full_page=True)

                # Replay the last hour from the log, from the subscription's page.
                await page.goto(base + "subscriptions/billing")
                await page.fill('input[name="since"]', "1h")
                await page.click('button[data-action="replay"]')
                await expect(page.locator(".flash")).to_contain_text("replay of billing since")

                async def replayed() -> bool:
                    return len(receiver.received) == 6

                await eventually(replayed, what="the events replayed from the log")
                assert sorted(orjson.loads(r.body)["order"] for r in receiver.received[3:]) == [0, 1, 2]

                # Pause and resume.
                await page.click('button[data-action="pause"]')
                await expect(page.locator(".flash")).to_contain_text("billing paused")
                assert await conn.fetchval("select state from ferry.subscriptions") == "paused"
                await page.click('button[data-action="resume"]')
                await expect(page.locator(".flash")).to_contain_text("billing resumed")
                assert await conn.fetchval("select state from ferry.subscriptions") == "active"
            finally:
                await browser.close()
    finally:
        await relay.stop()


async def test_while_the_database_is_down_the_dashboard_answers_503_and_the_pool_logs_one_line(
    pg: EmbeddedPostgres, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both were tracebacks: a bare 500 for every page, and asyncpg's "Failed to restore the pool
    connection floor" at each of its retries (18 in a short outage)."""
    proxy = FaultProxy(pg.port)
    await proxy.start()
    pool = await db.create_pool(proxy.url_for(db_url), min_size=1, max_size=2)
    floor = PoolFloorWarnings(interval=60)
    pool_log = logging.getLogger("asyncpg.pool")
    for earlier in [f for f in pool_log.filters if isinstance(f, PoolFloorWarnings)]:  # an in-process CLI's
        pool_log.removeFilter(earlier)
    pool_log.addFilter(floor)
    runner = web.AppRunner(Dashboard(pool).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    page = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(page) as response:
                assert response.status == 200
            await proxy.stop()  # the links cut, and new connections refused
            async with http.get(page) as response:
                text = await response.text()
            assert response.status == 503 and "The database cannot be reached: " in text, text

        async def retried() -> bool:  # asyncpg retries the floor after 1 s, then 2 s, ...
            return floor.left_out >= 1

        await eventually(retried, timeout=10, what="the pool to retry its connection floor")
    finally:
        logging.getLogger("asyncpg.pool").removeFilter(floor)
        await runner.cleanup()
        pool.terminate()
    lines = [r for r in caplog.records if r.name == "asyncpg.pool"]
    assert [(r.levelno, r.exc_info) for r in lines] == [(logging.WARNING, None)]
    assert lines[0].getMessage().startswith("database pool: cannot reconnect (")
    assert "Traceback" not in caplog.text


async def test_sampling_waits_longer_after_a_slow_sample(db_url: str) -> None:
    """The sampler runs whether anyone looks or not: with 3,000 subscriptions a sample took 7-15 s
    and it went again 2 s later, half a core for nobody (outside probe)."""
    pool = await db.create_pool(db_url, min_size=1, max_size=1)
    try:
        dashboard = Dashboard(pool, sample_interval=2.0)
        assert dashboard.pause_after(0.05) == 2.0
        assert dashboard.pause_after(7.0) == 70.0
        assert await dashboard.sample() == []  # a sample of no subscriptions
    finally:
        await pool.close()
