"""Prometheus metrics of one relay process.

Counters and histograms are fed by the relay as it works (deliveries,
failures by error class, request durations, commit-to-delivery lag, batch
sizes, ticks, database round trips). Gauges that describe the database
(lag, parked, dead per subscription; backfills' progress; each consumer
against the retention limit) are read from PostgreSQL when scraped,
at most once a second, so an idle relay that nobody scrapes does no extra
work. Every relay reports those database gauges, so aggregate them with
``max by (subscription)``; the counters are per relay, so ``sum`` them.

A subscription's histograms are ~50 series (three of 13-18 buckets): at
2,000 subscriptions ~100,000, which is why ``pgferry run --metrics-histograms
relay`` keeps one set labelled ``subscription="(all)"`` instead. The series of
a subscription that is gone from the database in two refreshes in a row are
removed, so subscriptions created and removed all day do not grow the scrape.

Each relay has its own registry (not prometheus_client's global one), so
several relays in one process, as in the tests, keep separate numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from pgferry.capture.backfill import Progress as BackfillProgress
from pgferry.delivery.http import HttpResult

if TYPE_CHECKING:
    from pgferry.delivery.context import Outcome

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
#: the subscription label of the histograms shared by every subscription (--metrics-histograms relay)
ALL_SUBSCRIPTIONS = "(all)"


@dataclass(frozen=True, slots=True)
class _SubscriptionSeries:
    """One subscription's children of the relay's delivery series."""

    deliveries: Counter
    lag: Histogram
    request_seconds: Histogram
    batch_events: Histogram
    #: error classes its failures were counted under (to remove them with it)
    failure_classes: set[str] = field(default_factory=set)


class RelayMetrics:
    def __init__(self, *, subscription_histograms: bool = True) -> None:
        self.subscription_histograms = subscription_histograms
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.deliveries = Counter("pgferry_deliveries", "Events delivered (2xx answer).", ["subscription"], registry=r)
        self.failures = Counter(
            "pgferry_delivery_failures",
            "Failed delivery attempts of events, by error class (http_status, timeout, connect, ...).",
            ["subscription", "error_class"],
            registry=r,
        )
        self.withdrawn = Counter(
            "pgferry_requests_withdrawn",
            "Requests taken back before they reached the wire: still waiting for a connection when their "
            "round let go of slow requests. Their events are sent later, once.",
            ["subscription"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "pgferry_request_duration_seconds",
            "Duration of each webhook request, success or failure.",
            ["subscription"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_lag = Histogram(
            "pgferry_delivery_lag_seconds",
            "From the event's creation (its transaction's start) to its 2xx answer, retries included.",
            ["subscription"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.batch_events = Histogram(
            "pgferry_batch_events",
            "Events per log batch handed to a subscription (batches with none are not counted).",
            ["subscription"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.ticks = Counter("pgferry_ticks", "Ticks recorded by this relay's ticker.", registry=r)
        self.db_roundtrip = Histogram(
            "pgferry_db_roundtrip_seconds",
            "Round-trip time of the relay's regular queries (tick, relay_round, status).",
            ["operation"],
            buckets=DB_BUCKETS,
            registry=r,
        )
        self.lag_events = Gauge(
            "pgferry_subscription_lag_events", "Events committed but not yet passed by the subscription's cursor.",
            ["subscription"], registry=r,
        )  # fmt: skip
        self.lag_seconds = Gauge(
            "pgferry_subscription_lag_seconds", "Age of the oldest tick the subscription's cursor has not passed.",
            ["subscription"], registry=r,
        )  # fmt: skip
        self.parked = Gauge(
            "pgferry_subscription_parked", "Events parked for retry (ferry.retries).", ["subscription"], registry=r
        )
        self.dead = Gauge(
            "pgferry_subscription_dead", "Dead letters (ferry.dead_letters).", ["subscription"], registry=r
        )
        self.active = Gauge(
            "pgferry_subscription_active", "1 if the subscription is active, 0 if paused or disabled.",
            ["subscription", "state"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "pgferry_in_flight", "Events in requests in flight from this relay.", ["subscription"], registry=r
        )
        self.is_ticker = Gauge("pgferry_relay_is_ticker", "1 if this relay is the elected ticker.", registry=r)
        self.owned = Gauge(
            "pgferry_relay_owned_subscriptions", "Subscriptions this relay delivers right now.", registry=r
        )
        self.streams = Gauge(
            "pgferry_streams_api", "The streams API of this relay: readers (SSE and long-polls), followed_streams, "
            "and since start hub_reads, hub_events, events_sent_live, let_go_behind (read on from the log), "
            "let_go_stalled, let_go_revoked.",
            ["what"], registry=r,
        )  # fmt: skip
        backfill_labels = ["backfill", "table", "target", "state"]
        self.backfill_rows = Gauge(
            "pgferry_backfill_rows_done", "Rows a running or paused backfill has written as READ events "
            "(target: the consumer it is for, empty for everyone).", backfill_labels, registry=r,
        )  # fmt: skip
        self.backfill_estimate = Gauge(
            "pgferry_backfill_rows_estimate", "Estimate of the rows a running or paused backfill will write "
            "(the planner's estimate of the table's rows at its start; -1: none, a backfill of an older version).",
            backfill_labels, registry=r,
        )  # fmt: skip
        self.backfill_rate = Gauge(
            "pgferry_backfill_rows_per_second", "Rows per second of a running or paused backfill since its start "
            "(pauses count; absent before its first rows).", backfill_labels, registry=r,
        )  # fmt: skip
        self.backfill_eta = Gauge(
            "pgferry_backfill_eta_seconds", "Seconds a running backfill has left at its rate since the start, "
            "against its estimate (absent while paused, orphaned or with no estimate).", backfill_labels, registry=r,
        )  # fmt: skip
        self.log_bytes = Gauge(
            "pgferry_log_bytes", "Size of the event log: its partitions with their indexes.", registry=r
        )
        self.consumer_age = Gauge(
            "pgferry_consumer_cursor_age_seconds", "Age of the oldest tick the consumer's cursor has not passed "
            "(webhook:NAME for a subscription).", ["consumer"], registry=r,
        )  # fmt: skip
        self.consumer_held = Gauge(
            "pgferry_consumer_held_bytes", "Bytes of closed log partitions the consumer keeps from being truncated.",
            ["consumer"], registry=r,
        )  # fmt: skip
        self.consumer_ratio = Gauge(
            "pgferry_consumer_retention_ratio", "Share of the retention limit the consumer has used (the larger of "
            "time and size; warnings at 0.5 and 0.8, stalled past 1).", ["consumer"], registry=r,
        )  # fmt: skip
        self.consumer_stalled = Gauge(
            "pgferry_consumer_stalled", "1 if the consumer fell behind the retention limit and no longer holds "
            "the log back.", ["consumer"], registry=r,
        )  # fmt: skip
        self.consumer_gap_events = Gauge(
            "pgferry_consumer_gap_events", "Events the consumer never got: the sum of its recorded gaps that moved its "
            "cursor (retention, a resume; WAL capture's are pgferry_consumer_wal_gaps).",
            ["consumer"], registry=r,
        )  # fmt: skip
        self.consumer_wal_gaps = Gauge(
            "pgferry_consumer_wal_gaps", "WAL capture's gaps of the consumer: slot losses (changes of WAL-captured "
            "tables that never reached the log, how many is unknown) and changes skipped with "
            "ferry.skip_wal_change.", ["consumer"], registry=r,
        )  # fmt: skip
        self.wal_events = Counter(
            "pgferry_wal_captured_events", "Events this relay decoded from the WAL into the log.", registry=r
        )
        self.wal_lag_bytes = Gauge(
            "pgferry_wal_lag_bytes", "WAL the capture slot holds back: written but not yet in the log (or skipped).",
            registry=r,
        )  # fmt: skip
        self.wal_lag_seconds = Gauge(
            "pgferry_wal_lag_seconds", "Seconds since WAL capture last caught up, while it is behind.", registry=r
        )
        self.wal_lost = Gauge(
            "pgferry_wal_slot_lost", "1 if WAL capture's slot was invalidated or dropped: changes were lost "
            "(pgferry status says what to do).", registry=r,
        )  # fmt: skip
        self.wal_failing = Gauge(
            "pgferry_wal_capture_failing", "1 while WAL capture cannot append the next change and holds every "
            "later one (pgferry status says why).", registry=r,
        )  # fmt: skip
        self.wal_identity_problems = Gauge(
            "pgferry_wal_identity_problems", "WAL-captured tables that no longer give what their capture needs: out "
            "of the publication (their changes are lost), or a REPLICA IDENTITY that gives DELETEs without a key "
            "or UPDATEs refused (pgferry status names them and the fix).",
            registry=r,
        )  # fmt: skip
        self._refreshed = 0.0
        #: each subscription's series of observe_outcomes, looked up once: labels() per round was a
        #: third of its cost with 1,000 subscriptions (a lock and a dict of tuples each)
        self._per_subscription: dict[str, _SubscriptionSeries] = {}
        #: subscriptions with series here that the last status refresh did not list
        self._missing: set[str] = set()

    # -- fed by the relay ----------------------------------------------------

    def observe_outcomes(self, subscription: str, outcomes: Sequence[Outcome], from_batch: bool) -> None:
        """Count one round of a subscription's deliveries (a log batch or a retry round)."""
        series = self._series(subscription)
        now = time.time()
        delivered = 0
        failed: dict[str, int] = {}
        requests: dict[int, float] = {}
        lag = series.lag
        for event, result in outcomes:
            if not isinstance(result, HttpResult):  # parked without an answer (behind its key, or in flight)
                continue
            requests[id(result)] = result.latency_ms
            if result.ok:
                delivered += 1
                lag.observe(max(0.0, now - event.created_at.timestamp()))
            else:
                cls = result.error_class or "unknown"
                failed[cls] = failed.get(cls, 0) + 1
        if delivered:
            series.deliveries.inc(delivered)
        for cls, n in failed.items():
            self.failures.labels(subscription, cls).inc(n)
            series.failure_classes.add(cls)
        for latency_ms in requests.values():
            series.request_seconds.observe(latency_ms / 1000)
        if from_batch and outcomes:
            series.batch_events.observe(len(outcomes))

    def observe_withdrawn(self, subscription: str, requests: int) -> None:
        self._series(subscription)  # so that the counter goes with the subscription's other series
        self.withdrawn.labels(subscription).inc(requests)

    def _series(self, subscription: str) -> _SubscriptionSeries:
        series = self._per_subscription.get(subscription)
        if series is None:
            shared = ALL_SUBSCRIPTIONS if not self.subscription_histograms else subscription
            series = self._per_subscription[subscription] = _SubscriptionSeries(
                self.deliveries.labels(subscription), self.delivery_lag.labels(shared),
                self.request_seconds.labels(shared), self.batch_events.labels(shared),
            )  # fmt: skip
        return series

    def _forget_gone(self, listed: set[str]) -> None:
        """Remove the series of subscriptions the database no longer has: missing from this refresh
        and the one before (one miss may be a subscription created after its status was read)."""
        missing = set(self._per_subscription) - listed
        for name in missing & self._missing:
            series = self._per_subscription.pop(name)
            for family in (self.deliveries, self.withdrawn):
                family.remove(name)
            for cls in series.failure_classes:
                self.failures.remove(name, cls)
            if self.subscription_histograms:
                for histogram in (self.delivery_lag, self.request_seconds, self.batch_events):
                    histogram.remove(name)
        self._missing = missing - self._missing

    def observe_tick(self, seconds: float, ticked: bool) -> None:
        self.db_roundtrip.labels("tick").observe(seconds)
        if ticked:
            self.ticks.inc()

    def observe_roundtrip(self, operation: str) -> Callable[[float], None]:
        histogram = self.db_roundtrip.labels(operation)
        return histogram.observe

    # -- read at scrape ------------------------------------------------------

    def due_for_refresh(self, max_age: float = 1.0) -> bool:
        return time.monotonic() - self._refreshed >= max_age

    def set_status(self, rows: Sequence[dict[str, Any]]) -> None:
        """Replace the database gauges with ferry.subscription_status() rows (gone subscriptions vanish)."""
        for gauge in (self.lag_events, self.lag_seconds, self.parked, self.dead, self.active):
            gauge.clear()
        for row in rows:
            name = row["name"]
            self.lag_events.labels(name).set(row["lag_events"] or 0)
            self.lag_seconds.labels(name).set(row["lag_seconds"] or 0)
            self.parked.labels(name).set(row["parked"] or 0)
            self.dead.labels(name).set(row["dead"] or 0)
            self.active.labels(name, row["state"]).set(1 if row["state"] == "active" else 0)
        self._forget_gone({row["name"] for row in rows})
        self._refreshed = time.monotonic()

    def set_retention(self, rows: Sequence[dict[str, Any]]) -> None:
        """Replace the retention gauges with ferry.retention_status() rows (gone consumers vanish)."""
        for gauge in (self.consumer_age, self.consumer_held, self.consumer_ratio, self.consumer_stalled,
                      self.consumer_gap_events, self.consumer_wal_gaps):  # fmt: skip
            gauge.clear()
        for row in rows:
            name = row["consumer"]
            self.log_bytes.set(row["log_bytes"] or 0)
            self.consumer_age.labels(name).set(row["lag_seconds"] or 0)
            self.consumer_held.labels(name).set(row["held_bytes"] or 0)
            self.consumer_ratio.labels(name).set(max(row["time_pct"] or 0, row["size_pct"] or 0) / 100)
            self.consumer_stalled.labels(name).set(1 if row["stalled_at"] is not None else 0)
            self.consumer_gap_events.labels(name).set(row["gap_events"] or 0)
            self.consumer_wal_gaps.labels(name).set(row.get("wal_gaps") or 0)

    def observe_wal(self, events: int) -> None:
        self.wal_events.inc(events)

    def set_wal(self, wal: Mapping[str, Any] | None) -> None:
        """WAL capture's slot gauges (all 0 when nothing is captured from the WAL)."""
        self.wal_lag_bytes.set(wal["lag_bytes"] if wal is not None else 0)
        self.wal_lag_seconds.set(wal["lag_seconds"] if wal is not None else 0)
        self.wal_lost.set(1 if wal is not None and wal["stopped"] else 0)
        self.wal_failing.set(1 if wal is not None and wal["error"] else 0)
        self.wal_identity_problems.set(len(wal.get("identity_problems") or ()) if wal is not None else 0)

    def set_backfills(self, backfills: Sequence[BackfillProgress]) -> None:
        """Replace the backfill gauges with the backfills running or paused now (finished ones vanish)."""
        for gauge in (self.backfill_rows, self.backfill_estimate, self.backfill_rate, self.backfill_eta):
            gauge.clear()
        for b in backfills:
            labels = (str(b.id), b.table, b.target or "", b.state)
            self.backfill_rows.labels(*labels).set(b.rows_done)
            self.backfill_estimate.labels(*labels).set(b.total if b.total is not None else -1)
            if (rate := b.rate) is not None:
                self.backfill_rate.labels(*labels).set(rate)
            if (eta := b.eta) is not None:
                self.backfill_eta.labels(*labels).set(eta.total_seconds())

    def set_relay(self, is_ticker: bool, in_flight: dict[str, int], streams: dict[str, float] | None = None) -> None:
        for what, value in (streams or {}).items():
            self.streams.labels(what).set(value)
        self.is_ticker.set(1 if is_ticker else 0)
        self.owned.set(len(in_flight))
        self.in_flight.clear()
        for name, n in in_flight.items():
            self.in_flight.labels(name).set(n)


class _Gathered:
    """A collector of metric families already made (prometheus_client renders them as usual)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def gather_processes(
    texts: Mapping[str, str], counts: Mapping[str, float], ages: Mapping[str, float] | None = None
) -> bytes:
    """The metrics of every process of `pgferry run --processes N` as one exposition.

    ``texts``: each running child's /metrics text by slot; every series gets a
    ``process`` label with the slot (counters of a restarted child start over,
    which Prometheus' rate() handles as any restart). ``counts``: the
    supervisor's own numbers (processes, running, restarts). ``ages``: how old each
    child's text is (0: this scrape's; older: its last answer, standing in for one that
    did not come in time). Aggregate as for
    several relays: ``sum`` the counters, ``max`` the database gauges.

    The children's texts are merged as text, family by family, each sample line
    getting the label where its label set ends: parsing them with
    prometheus_client and rendering the result again held the supervisor's loop
    for seconds at 1,000 subscriptions (73K lines a child). The result parses as
    the children's samples with the label added (property-tested against
    prometheus_client's parser, tests/operator/test_metrics_gather.py).
    """
    families: dict[str, tuple[list[str], list[str]]] = {}  # name: (HELP and TYPE lines, sample lines)
    for slot, text in texts.items():
        label = f'process="{_escape_label_value(slot)}"'
        header: list[str] | None = None
        samples: list[str] = []
        for line in text.split("\n"):  # not splitlines(): "\r", "\x1c", "\u2028" may be in label values
            if line.startswith("# HELP "):
                name = line.split(" ", 3)[2]
                known = families.get(name)
                header = None if known is not None else [line]
                if known is None:
                    known = families[name] = (header or [], [])
                samples = known[1]
            elif line.startswith("#"):
                if header is not None:  # its TYPE line, kept from the first child that has the family
                    header.append(line)
            elif line:
                samples.append(_with_label(line, label))
    processes = GaugeMetricFamily(
        "pgferry_relay_processes", "Relay processes under this supervisor: wanted (--processes) and running.",
        labels=["state"],
    )  # fmt: skip
    processes.add_metric(["wanted"], counts.get("processes", 0))
    processes.add_metric(["running"], counts.get("running", 0))
    restarts = CounterMetricFamily(
        "pgferry_relay_process_restarts", "Relay processes the supervisor restarted after they died unasked."
    )
    restarts.add_metric([], counts.get("restarts", 0))
    age = GaugeMetricFamily(
        "pgferry_relay_process_metrics_age_seconds",
        "How old each process's series in this scrape are: 0, or its last answer's age when it did not answer in time.",
        labels=["process"],
    )  # fmt: skip
    for slot, seconds in (ages or {}).items():
        age.add_metric([slot], seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Gathered([processes, restarts, age]))
    merged = "".join("\n".join((*header, *samples)) + "\n" for header, samples in families.values())
    return merged.encode() + generate_latest(registry)


def _with_label(line: str, label: str) -> str:
    """A sample line of the text format with ``label`` (``name="value"``) added to its label set.

    The set ends at the line's last ``}``: after it come only the value and an optional
    timestamp, which hold none, while label values may (the format escapes only backslash,
    double quote and newline in them).
    """
    space = line.find(" ")
    brace = line.find("{")
    if brace == -1 or brace > space:  # ``name value``: no label set yet
        return f"{line[:space]}{{{label}}}{line[space:]}"
    end = line.rfind("}")
    return f"{line[:end]}{',' if end > brace + 1 else ''}{label}{line[end:]}"


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: Prometheus samples by (name, sorted labels), as ``parse_samples`` reads them.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    """The samples of a Prometheus text exposition (a relay's /metrics), by name and labels: what
    the benchmarks and the tests read back."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series_sum(samples: Samples, name: str) -> float:
    """A series summed over its labels (and a supervisor's processes)."""
    return sum(v for (sample, _labels), v in samples.items() if sample == name)
