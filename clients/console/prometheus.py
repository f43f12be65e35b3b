"""A node's GPU metrics over a range (1 h, 6 h, 24 h), from Prometheus's HTTP API
(`query_range`).

The series are dcgm-exporter's (the node agent exports the same names), selected by their
`Hostname` label; one chart per metric, every GPU a series on one time axis (a value
Prometheus has not for a GPU at a step is null: a gap, not a zero). The step grows with
the range so a chart holds about 240 points whatever it spans.

Prometheus unset, or not answering, is what the page shows, never an error page: an outage
shows as "Prometheus unavailable: ..." (its cause), never as empty charts ("no GPU
series" is only what an answering Prometheus says).
"""

from __future__ import annotations

import re
import time

import httpx
from pydantic import BaseModel, Field

from autoclusters.integrations.prometheus import PrometheusUnavailable, api_data

# (series, title, unit)
GPU_METRICS: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation", "%"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature", "°C"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power", "W"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer used", "MiB"),
]
WINDOW_S = 3600
STEP_S = 15
RANGES: dict[str, int] = {"1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}
POINTS = 240  # a chart's points, whatever its range: the step is range / POINTS
_LABEL_VALUE = re.compile(r'[\\"\n]')


class Chart(BaseModel):
    metric: str
    title: str
    unit: str
    gpu: str
    points: list[tuple[float, float]]  # (epoch s, value)


class GpuSeries(BaseModel):
    gpu: str
    values: list[float | None]  # one per `times` entry


class MetricChart(BaseModel):
    """One metric of the node, every GPU a series over the same times."""

    metric: str
    title: str
    unit: str
    times: list[float]  # epoch s
    series: list[GpuSeries]


class NodeMetrics(BaseModel):
    configured: bool
    prometheus_url: str | None = None
    error: str | None = None
    range: str = "1h"
    start: float | None = None
    end: float | None = None
    charts: list[Chart] = Field(default_factory=list)  # one per metric and GPU
    metrics: list[MetricChart] = Field(default_factory=list)  # one per metric


def by_metric(charts: list[Chart]) -> list[MetricChart]:
    """The per-GPU charts as one chart per metric: the union of their times, each GPU's
    value at each (None where it has none)."""
    out: list[MetricChart] = []
    for metric, title, unit in GPU_METRICS:
        mine = [c for c in charts if c.metric == metric]
        if not mine:
            continue
        times = sorted({t for c in mine for t, _ in c.points})
        series = []
        for c in mine:
            at = dict(c.points)
            series.append(GpuSeries(gpu=c.gpu, values=[at.get(t) for t in times]))
        out.append(MetricChart(metric=metric, title=title, unit=unit, times=times, series=series))
    return out


def _label(value: str) -> str:
    # PromQL string literal: the node name is the caller's input.
    return _LABEL_VALUE.sub(lambda m: "\\" + {"\n": "n"}.get(m.group(), m.group()), value)


async def node_metrics(
    http: httpx.AsyncClient,
    base_url: str | None,
    node: str,
    *,
    now: float | None = None,
    span: str = "1h",
) -> NodeMetrics:
    if span not in RANGES:
        raise ValueError(f"range: one of {', '.join(RANGES)}, not {span!r}")
    if not base_url:
        return NodeMetrics(configured=False, range=span)
    end = now if now is not None else time.time()
    window_s = RANGES[span]
    step_s = max(STEP_S, window_s // POINTS)
    root = base_url.rstrip("/")
    charts: list[Chart] = []
    try:
        for metric, title, unit in GPU_METRICS:
            data = await api_data(
                http,
                root,
                "/api/v1/query_range",
                {
                    "query": f'{metric}{{Hostname="{_label(node)}"}}',
                    "start": f"{end - window_s:.0f}",
                    "end": f"{end:.0f}",
                    "step": str(step_s),
                },
            )
            try:
                for series in data["result"]:
                    gpu = str(series["metric"].get("gpu", "?"))
                    points = [(float(t), float(v)) for t, v in series.get("values", [])]
                    charts.append(
                        Chart(metric=metric, title=title, unit=unit, gpu=gpu, points=points)
                    )
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise PrometheusUnavailable(f"{metric}: a malformed series ({e!r})") from e
    except PrometheusUnavailable as e:
        return NodeMetrics(configured=True, prometheus_url=root, error=str(e), range=span)
    order = {metric: i for i, (metric, _, _) in enumerate(GPU_METRICS)}
    charts.sort(key=lambda c: (order[c.metric], int(c.gpu) if c.gpu.isdigit() else 1 << 20, c.gpu))
    return NodeMetrics(
        configured=True,
        prometheus_url=root,
        range=span,
        start=end - window_s,
        end=end,
        charts=charts,
        metrics=by_metric(charts),
    )
