"""Prometheus's HTTP API, read strictly: an answer is the `data` of a `"status": "success"`
envelope, or `PrometheusUnavailable`.

What Prometheus 2.42 answers when it cannot answer (tests/data/outages/ has each, captured):
503 `Service Unavailable` in plain text while its TSDB opens; 503 `{"status": "error",
"errorType": "timeout"}` for a query that ran out of time; 422 `execution` (too many
samples); 400 `bad_data` (the query does not parse). With a refused connection, a proxy's
HTML, or a body that is not JSON, none of them is "no data": a reader that took them for an
empty result would read an outage as zero demand or a node without metrics. An empty result
in a success envelope is an answer (no series matched).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from autoclusters.core.unavailable import Unavailable

PROMETHEUS = "Prometheus"


class PrometheusUnavailable(Unavailable):
    """Prometheus gave no trustworthy answer. `status`: the HTTP status, if one came back;
    `error_type`: the API's `errorType` (timeout, execution, bad_data, unavailable, ...)."""

    def __init__(
        self, message: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(PROMETHEUS, message)
        self.status = status
        self.error_type = error_type


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


async def api_data(
    http: httpx.AsyncClient, base_url: str, path: str, params: dict[str, str]
) -> dict[str, Any]:
    """GET `path` (e.g. /api/v1/query) and return the answer's `data`, or raise."""
    where = f"GET {path}"
    try:
        resp = await http.get(f"{base_url.rstrip('/')}{path}", params=params)
    except httpx.HTTPError as e:  # refused, reset, timed out
        raise PrometheusUnavailable(f"{where}: {_why(e)}") from e
    status = resp.status_code
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = resp.text.strip()[:200] or resp.reason_phrase
        raise PrometheusUnavailable(
            f"{where}: {status} {text!r} (not the API's JSON)", status=status
        )
    if body.get("status") != "success" or not 200 <= status < 300:
        kind = str(body.get("errorType") or "error")
        raise PrometheusUnavailable(
            f"{where}: {status} {kind}: {body.get('error') or 'no error message'}",
            status=status,
            error_type=kind,
        )
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusUnavailable(f"{where}: {status} success without data", status=status)
    return data


async def instant_value(http: httpx.AsyncClient, base_url: str, query: str) -> float | None:
    """The first sample of an instant query. None: no series (or NaN/Inf), which Prometheus
    answered; `PrometheusUnavailable`: it did not answer (see the module docstring)."""
    data = await api_data(http, base_url, "/api/v1/query", {"query": query})
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        sample: Any = result
    elif kind == "vector" and isinstance(result, list):
        if not result:
            return None
        sample = result[0].get("value") if isinstance(result[0], dict) else None
    else:
        raise PrometheusUnavailable(
            f"query {query!r} answered a {kind or 'malformed'} result, not a vector or scalar"
        )
    try:
        value = float(sample[1])
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise PrometheusUnavailable(f"query {query!r}: malformed sample {sample!r}") from e
    return None if math.isnan(value) or math.isinf(value) else value
