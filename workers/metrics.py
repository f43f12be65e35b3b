"""The worker's Prometheus metrics, on a registry of its own, served over HTTP on
`[worker] metrics_port` (settings; off by default): loopback, or any address with a token
(integrations/metrics_http.py).

Workflow code stays deterministic, so nothing here runs inside a workflow; each figure
comes from the worker's side:
- step durations, fleet-guard admissions, incidents closed and their job and capacity
  recovery: the activity interceptor (`workers/metrics_interceptor.py`), which times
  every activity and, when the closing notification of an incident has run, reads the
  incident's timeline with the `status` query;
- incidents open now by status, fault and rung, and each fleet guard's breaker, queue
  and counts: a collector that reads Temporal at scrape time (`workers/metrics_collector.py`);
- Slack deliveries: the Slack notifier's outcome callback (`slack_delivery`);
- stuck runs and what was done about them: the stuck-run doctor (`workers/stuck_runs.py`).

Names follow `autoclusters_<stage>_<noun>_<unit|total>`; the Grafana dashboard's queries
name only series these registries export (tests/project/test_grafana_dashboard.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from autoclusters.workers.stuck_runs import ResetOutcome

# Steps run from milliseconds (a Slurm call) to the better part of an hour (a replacement,
# waiting for a node to go idle).
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600)
# Job recovery is seconds; capacity recovery is a boot (minutes) or a spare (seconds).
RECOVERY_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)


class WorkerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        # One registry per worker, so two workers in one process (tests) count apart.
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.step_duration = Histogram(
            "autoclusters_worker_step_duration_seconds",
            "Duration of each activity (a runbook step) by activity type and outcome "
            "(ok, failed, cancelled); every attempt counts.",
            ["activity", "outcome"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.incidents_closed = Counter(
            "autoclusters_incidents_closed",
            "Incidents closed, by final status (resolved, failed, rejected, observed, "
            "monitored, cancelled), fault and the rung they ended on.",
            ["cluster", "status", "fault", "rung"],
            registry=r,
        )
        self.job_recovery = Histogram(
            "autoclusters_incident_job_recovery_seconds",
            "From the incident's opening to its node's jobs requeued and released (free to "
            "restart elsewhere); incidents whose node ran requeueable jobs.",
            ["cluster", "fault"],
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.capacity_recovery = Histogram(
            "autoclusters_incident_capacity_recovery_seconds",
            "From the incident's opening to its capacity back in service: the node returned "
            "(via=repair) or a hot spare serving in its place (via=spare); resolved incidents.",
            ["cluster", "fault", "via"],
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.guard_admissions = Counter(
            "autoclusters_guard_admissions",
            "Fleet-guard answers to an incident asking to quarantine or repair: admitted, "
            "or held (queued, or to ask again).",
            ["cluster", "kind", "outcome"],
            registry=r,
        )
        self.slack_deliveries = Counter(
            "autoclusters_slack_deliveries",
            "Slack notifications by event and outcome: sent, duplicate (already in the "
            "thread: a retried activity), timeout, slack_error, error, cancelled.",
            ["event", "outcome"],
            registry=r,
        )

        self.stuck_runs = Counter(
            "autoclusters_worker_stuck_runs",
            "Runs found failing their workflow task, by what the stuck-run doctor did: "
            "reset (history not replayable: reset to the last point that replays), "
            "not_replay (left alone), no_reset_point or limit (left to a human).",
            ["workflow_type", "outcome"],
            registry=r,
        )

    def slack_delivery(self, event: str, outcome: str) -> None:
        """The Slack notifier's outcome callback."""
        self.slack_deliveries.labels(event, outcome).inc()

    def stuck_run(self, outcome: ResetOutcome) -> None:
        """The stuck-run doctor's outcome callback."""
        self.stuck_runs.labels(outcome.run.workflow_type, outcome.outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
