"""A node's GPU metrics for the last hour, from Prometheus's HTTP API (`query_range`).

The series are dcgm-exporter's (the node agent exports the same names), selected by their
`Hostname` label; one chart per metric and GPU. Prometheus unset, or not answering, is what
the page shows, never an error page: an outage shows as "Prometheus unavailable: ..." (its
cause), never as empty charts ("no GPU series" is only what an answering Prometheus says).
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
_LABEL_VALUE = re.compile(r'[\\"\n]')


class Chart(BaseModel):
    metric: str
    title: str
    unit: str
    gpu: str
    points: list[tuple[float, float]]  # (epoch s, value)


class NodeMetrics(BaseModel):
    configured: bool
    prometheus_url: str | None = None
    error: str | None = None
    charts: list[Chart] = Field(default_factory=list)


def _label(value: str) -> str:
    # PromQL string literal: the node name is the caller's input.
    return _LABEL_VALUE.sub(lambda m: "\\" + {"\n": "n"}.get(m.group(), m.group()), value)


async def node_metrics(
    http: httpx.AsyncClient, base_url: str | None, node: str, *, now: float | None = None
) -> NodeMetrics:
    if not base_url:
        return NodeMetrics(configured=False)
    end = now if now is not None else time.time()
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
                    "start": f"{end - WINDOW_S:.0f}",
                    "end": f"{end:.0f}",
                    "step": str(STEP_S),
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
        return NodeMetrics(configured=True, prometheus_url=root, error=str(e))
    order = {metric: i for i, (metric, _, _) in enumerate(GPU_METRICS)}
    charts.sort(key=lambda c: (order[c.metric], int(c.gpu) if c.gpu.isdigit() else 1 << 20, c.gpu))
    return NodeMetrics(configured=True, prometheus_url=root, charts=charts)
