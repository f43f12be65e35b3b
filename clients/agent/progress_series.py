"""The jobs' progress as Prometheus series, beside the GPU ones (core/job_progress.py).

Per rank of this node (labels `job_id`, `rank`, `Hostname`: the node, as dcgm-exporter
names it; not `job` or `node`, which Prometheus' scrape configuration sets on every series
of the target): the last step, its wall time and busy time (outside collectives and
declared pauses), seconds since it, since when the rank is inside a collective (0: it is
not), and its heartbeat's age. Per job this node runs ranks of: its hang threshold. A
rank of another node (a shared progress directory) is that node's agent's to export.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from autoclusters.core.job_progress import RankProgress

LABELS = ["job_id", "rank", "Hostname"]
PREFIX = "autoclusters_job_"
LAST_STEP = PREFIX + "last_step"
STEP_SECONDS = PREFIX + "step_seconds"
BUSY_SECONDS = PREFIX + "step_busy_seconds"
SINCE_STEP = PREFIX + "seconds_since_step"
COLLECTIVE_SINCE = PREFIX + "in_collective_since_timestamp_seconds"
HEARTBEAT_AGE = PREFIX + "heartbeat_age_seconds"
HANG_THRESHOLD = PREFIX + "hang_threshold_seconds"


def progress_series(
    node: str, now: float, ranks: list[RankProgress], thresholds: dict[str, float]
) -> Iterator[Metric]:
    mine = [r for r in ranks if r.node == node]
    families = {
        LAST_STEP: GaugeMetricFamily(LAST_STEP, "The rank's last step.", labels=LABELS),
        STEP_SECONDS: GaugeMetricFamily(
            STEP_SECONDS, "Wall time of the rank's last step (s).", labels=LABELS
        ),
        BUSY_SECONDS: GaugeMetricFamily(
            BUSY_SECONDS, "The last step's time outside collectives and declared pauses (s).",
            labels=LABELS,
        ),
        SINCE_STEP: GaugeMetricFamily(
            SINCE_STEP, "Seconds since the rank's last step.", labels=LABELS
        ),
        COLLECTIVE_SINCE: GaugeMetricFamily(
            COLLECTIVE_SINCE, "When the rank entered the collective it is in (epoch s); 0: "
            "not in one.", labels=LABELS,
        ),
        HEARTBEAT_AGE: GaugeMetricFamily(
            HEARTBEAT_AGE, "Seconds since the rank last wrote its progress.", labels=LABELS
        ),
    }  # fmt: skip
    for r in mine:
        labels = [r.job, str(r.rank), node]
        families[LAST_STEP].add_metric(labels, r.step)
        if r.step_time_s is not None:
            families[STEP_SECONDS].add_metric(labels, r.step_time_s)
        if r.busy_s is not None:
            families[BUSY_SECONDS].add_metric(labels, r.busy_s)
        if r.stepped_at is not None:
            families[SINCE_STEP].add_metric(labels, max(0.0, now - r.stepped_at))
        families[COLLECTIVE_SINCE].add_metric(labels, r.collective_since or 0.0)
        families[HEARTBEAT_AGE].add_metric(labels, max(0.0, now - r.written_at))
    yield from families.values()
    threshold = GaugeMetricFamily(
        HANG_THRESHOLD, "The job's hang threshold: no step for this long is a hang (s).",
        labels=["job_id", "Hostname"],
    )  # fmt: skip
    for job in sorted({r.job for r in mine}):
        if job in thresholds:
            threshold.add_metric([job, node], thresholds[job])
    yield threshold
