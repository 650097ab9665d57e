"""`pgferry run --processes N` merges its children's /metrics as text: what it serves must parse, with
prometheus_client's own parser, as exactly the children's samples with a ``process`` label added."""

import asyncio
import math

import pytest
from aiohttp import ClientSession, web
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgferry.ops import web as ops_web
from pgferry.ops.metrics import RelayMetrics, gather_processes
from pgferry.relay.surface import SupervisorView, WebSettings

#: label values as the relay can see them: subscription and consumer names hold anything printable
#: and more ("}", quotes, backslashes, newlines, spaces, non-ASCII)
VALUES = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
LABELS = st.lists(st.sampled_from(["subscription", "error_class", "what"]), unique=True, max_size=2)
FAMILY = st.tuples(st.sampled_from(["counter", "gauge", "histogram"]), LABELS, st.lists(VALUES, max_size=4))
CHILD = st.lists(FAMILY, max_size=4)


def _render(families: list[tuple[str, list[str], list[str]]]) -> str:
    registry = CollectorRegistry(auto_describe=True)
    for i, (kind, labels, values) in enumerate(families):
        name, doc = f"m{i}_{kind}", f'doc of {kind} with "quotes", \\ and\nnewline'
        metric: Counter | Gauge | Histogram
        if kind == "counter":
            metric = Counter(name, doc, labels, registry=registry)
        elif kind == "gauge":
            metric = Gauge(name, doc, labels, registry=registry)
        else:
            metric = Histogram(name, doc, labels, buckets=(0.1, 1), registry=registry)
        for n, value in enumerate(values or [""]):
            child = metric.labels(*([value] * len(labels))) if labels else metric
            if isinstance(child, Histogram):
                child.observe(n / 2)
            elif isinstance(child, Counter):
                child.inc(n + 0.5)
            else:
                child.set(math.inf if n == 3 else -n)
    return generate_latest(registry).decode()


def _samples(
    text: str, add: dict[str, str] | None = None
) -> list[tuple[str, str, str, tuple[tuple[str, str], ...], float]]:
    return sorted(
        (family.name, family.type, s.name, tuple(sorted({**s.labels, **(add or {})}.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )


def _check(children: dict[str, str]) -> None:
    gathered = gather_processes(children, {"processes": 2, "running": len(children), "restarts": 1}).decode()
    expected = [s for slot, text in children.items() for s in _samples(text, {"process": slot})]
    supervisor = [s for s in _samples(gathered) if s[0].startswith("pgferry_relay_process")]
    assert sorted(s for s in _samples(gathered) if s not in supervisor) == sorted(expected)
    assert {(s[2], s[4]) for s in supervisor} >= {
        ("pgferry_relay_processes", 2.0),
        ("pgferry_relay_process_restarts_total", 1.0),
    }


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["1", "2", "3"]), CHILD, min_size=1, max_size=3))
@example({"1": [("counter", ["subscription"], ['a}"b\\c\n d'])], "2": [("counter", ["subscription"], ["x"])]})
@example({"1": [("gauge", [], [])], "2": [("histogram", ["what"], ["", "{}", "} 1"])]})
@example({"1": [("counter", ["subscription"], ["\r", "\u2028", "\x1c"])]})  # not line ends in the format
def test_the_merged_text_parses_as_every_childs_samples_labelled_with_its_process(
    children: dict[str, list[tuple[str, list[str], list[str]]]],
) -> None:
    _check({slot: _render(families) for slot, families in children.items()})


def test_a_relays_own_metrics_merge_as_they_parse() -> None:
    """The real families (counters with _created, histograms, label-less gauges) of two relays."""
    texts = {}
    for slot in ("1", "2"):
        metrics = RelayMetrics()
        metrics.deliveries.labels(f"sub {slot}").inc(3)
        metrics.request_seconds.labels("shared").observe(0.02)
        metrics.set_relay(slot == "1", {"shared": 2}, {"readers": 1.0})
        texts[slot] = generate_latest(metrics.registry).decode()
    _check(texts)


async def test_a_child_that_does_not_answer_in_time_is_served_from_its_last_answer_with_its_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left out, a slow child's series vanished from the scrape: a ticker-count alert fired and
    counters looked reset (a child rendering ~100K series under load; outside probe)."""
    slow = False

    async def child_metrics(_: web.Request) -> web.Response:
        if slow:
            await asyncio.sleep(1)
        return web.Response(text="# HELP pgferry_relay_is_ticker x\n# TYPE pgferry_relay_is_ticker gauge\n"
                                 "pgferry_relay_is_ticker 1.0\n")  # fmt: skip

    app = web.Application()
    app.router.add_get("/metrics", child_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    child = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    monkeypatch.setattr(ops_web, "GATHER_TIMEOUT", 0.3)
    announced: dict[str, str] = {}
    supervisor = ops_web.SupervisorWeb(SupervisorView(
        url="postgresql://unused", web=WebSettings(metrics_port=0), children=lambda: {"0": child},
        counts=lambda: {"processes": 1, "running": 1, "restarts": 0}, announce=announced.__setitem__,
    ))  # fmt: skip
    await supervisor.start()
    try:
        async with ClientSession() as session:

            async def scrape() -> dict[tuple[str, str], float]:
                async with session.get(announced["metrics"]) as response:
                    text = await response.text()
                return {(s.name, s.labels.get("process", "")): s.value
                        for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

            fresh = await scrape()
            assert fresh[("pgferry_relay_is_ticker", "0")] == 1
            assert fresh[("pgferry_relay_process_metrics_age_seconds", "0")] == 0
            slow = True
            stale = await scrape()
            assert stale[("pgferry_relay_is_ticker", "0")] == 1  # the last answer stands in
            assert stale[("pgferry_relay_process_metrics_age_seconds", "0")] > 0.25
            monkeypatch.setattr(ops_web, "STALE_LIMIT", 0.1)
            gone = await scrape()
            assert ("pgferry_relay_is_ticker", "0") not in gone  # too old: left out
            # The late answer still counts, for the scrape after it arrives: thrown away, a child
            # that always took longer than the wait aged out of every scrape (outside probe).
            await asyncio.sleep(1)
            monkeypatch.setattr(ops_web, "STALE_LIMIT", 60.0)
            late = await scrape()
            assert late[("pgferry_relay_is_ticker", "0")] == 1
            assert late[("pgferry_relay_process_metrics_age_seconds", "0")] < 1.0
    finally:
        await supervisor.stop()
        await runner.cleanup()
