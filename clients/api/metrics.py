"""The API's Prometheus metrics, on a registry of its own (one per app, so two apps in one
process, as in tests, count separately)."""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

M = TypeVar("M", Counter, Histogram)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ApiMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.alerts_received = Counter(
            "autoclusters_api_alerts_received",
            "Alerts and agent reports received, by source and status (firing, resolved).",
            ["source", "status"],
            registry=r,
        )
        self.alerts_deduplicated = Counter(
            "autoclusters_api_alerts_deduplicated",
            "Alerts already accepted before (same fingerprint+startsAt, or report_id).",
            ["source"],
            registry=r,
        )
        self.alerts_rejected = Counter(
            "autoclusters_api_alerts_rejected",
            "Alerts not acted on: unmapped alertname, no node label, bad fault, unknown node "
            "(the payload's alerts for known nodes go ahead).",
            ["source", "reason"],
            registry=r,
        )
        self.requests_partial = Counter(
            "autoclusters_api_requests_partial",
            "Writes answered 202 in part: firing alerts naming nodes the inventory does not "
            "know were left out (the answer's unknown_nodes); the rest went ahead.",
            ["source"],
            registry=r,
        )
        self.alerts_trailing = Counter(
            "autoclusters_api_alerts_trailing",
            "Alerts of a fault kind the node's open incident has, answered joined at once "
            "and delivered to it afterwards, in batches.",
            registry=r,
        )
        self.alerts_trailing_lost = Counter(
            "autoclusters_api_alerts_trailing_lost",
            "Alerts answered joined whose delivery failed every retry (the source's next "
            "re-send delivers them again).",
            registry=r,
        )
        self.alerts_truncated = Counter(
            "autoclusters_api_alerts_truncated",
            "Alerts Alertmanager left out of its notifications (truncatedAlerts).",
            registry=r,
        )
        self.requests_refused = Counter(
            "autoclusters_api_requests_refused",
            "Write requests refused as a whole, by reason (unauthorized, invalid, "
            "unknown_node, too_large, temporal_unavailable, error).",
            ["endpoint", "reason"],
            registry=r,
        )
        self.incidents = Counter(
            "autoclusters_api_incidents",
            "Accepted firing alerts by outcome: opened a new incident, or joined an open one.",
            ["outcome"],
            registry=r,
        )
        self.temporal_errors = Counter(
            "autoclusters_api_temporal_errors",
            "Temporal calls that failed: unavailable, timeout, closing (incident closing), "
            "not_ready (its workflow task failed, retried), inventory (Slurm node list "
            "unreadable), other.",
            ["kind"],
            registry=r,
        )
        self.request_duration = Histogram(
            "autoclusters_api_request_duration_seconds",
            "HTTP request latency, by endpoint and status code.",
            ["endpoint", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.temporal_duration = Histogram(
            "autoclusters_api_temporal_call_duration_seconds",
            "Latency of one open-or-join (update-with-start) call to Temporal.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "autoclusters_api_batch_alerts",
            "Alerts carried by one Temporal call (a node's alerts of one fault kind that "
            "arrived while its previous call was in flight).",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=r,
        )
        self.storm = Gauge(
            "autoclusters_api_storm",
            "1 while the API is in an alert storm (api_storm_nodes): answers do not wait "
            "for a worker, and what joins open incidents reaches them in batches.",
            registry=r,
        )
        self.temporal_in_flight = Gauge(
            "autoclusters_api_temporal_in_flight",
            "Temporal calls in flight.",
            registry=r,
        )

    def of(self, metric: M, *labels: str) -> M:
        """`metric.labels(*labels)`, looked up once (labels() validates and locks: a
        tenth of an alert's CPU in a storm, for four counters)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]

    def render(self) -> bytes:
        return generate_latest(self.registry)
