"""Every dashboard answer says it is not to be framed and what the page may run
(Content-Security-Policy): the token page had no X-Frame-Options and no page had a policy
(outside probe). The policy lets the page's own refresh run, in headless Chromium."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import aiohttp
import asyncpg

import pgferry
from tests.helpers import CHROMIUM, CHROMIUM_ARGS, FAST, RunningRelay, eventually


async def _started(relay: RunningRelay) -> str:
    async def up() -> bool:
        return "dashboard" in relay.relay.addresses

    await eventually(up, what="the dashboard to listen")
    return relay.relay.addresses["dashboard"].rstrip("/")


def _guarded(headers: Mapping[str, str]) -> None:
    policy = headers["Content-Security-Policy"]
    assert headers["X-Frame-Options"] == "DENY", headers
    assert (
        "frame-ancestors 'none'" in policy
        and "default-src 'none'" in policy
        and "unsafe-inline" not in (policy.split("script-src", 1)[1].split(";", 1)[0])
    ), policy


async def test_every_answer_forbids_framing_and_sets_a_policy_the_page_s_script_runs_under(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry
) -> None:
    from playwright.async_api import async_playwright

    await ferry.subscribe("hook", ["s"], "http://127.0.0.1:9/x")
    relay = RunningRelay(db_url, replace(FAST, dashboard_port=0, dashboard_token="let-me-in"))
    try:
        base = await _started(relay)
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/") as r:  # the token page
                assert r.status == 401 and "token required" in await r.text()
                _guarded(r.headers)
            auth = {"Authorization": "Bearer let-me-in"}
            for path, status in (("/", 200), ("/subscriptions/hook", 200), ("/events/x", 404)):
                async with session.get(base + path, headers=auth) as r:
                    assert r.status == status, path
                    _guarded(r.headers)

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await browser.new_page()
                violations: list[str] = []
                page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
                await page.goto(base + "/?token=let-me-in")
                async with page.expect_request(lambda r: r.url.rstrip("/") == base, timeout=10_000):
                    pass  # the refresh script fetched the page again: it ran
                assert await page.locator('tr[data-subscription="hook"]').count() == 1
                assert not violations, violations
            finally:
                await browser.close()
    finally:
        await relay.stop()
