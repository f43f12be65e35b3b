"""How the API says no: an `ApiError` carries the status, body and headers of a refusal,
and `Refusals` makes each one, counted by endpoint and reason
(`autoclusters_api_requests_refused_total`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from autoclusters.clients.api.metrics import ApiMetrics


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        reason: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(body.get("detail", reason))
        self.status, self.reason, self.body, self.headers = status, reason, body, headers or {}


async def answer_refusal(_request: Request, e: ApiError) -> JSONResponse:
    """The app's handler for ApiError: the refusal as JSON."""
    return JSONResponse(e.body, status_code=e.status, headers=e.headers)


class Refusals:
    def __init__(self, metrics: ApiMetrics, retry_after_s: int) -> None:
        self._metrics = metrics
        self._retry_after_s = retry_after_s

    def refuse(
        self, status: int, reason: str, endpoint: str, error: str, detail: str, **extra: Any
    ) -> ApiError:
        self._metrics.requests_refused.labels(endpoint, reason).inc()
        return ApiError(status, reason, {"error": error, "detail": detail, **extra})

    def unavailable(self, e: Exception, endpoint: str) -> ApiError:
        """503 with Retry-After: Temporal (or Slurm's node list) could not be reached."""
        self._metrics.requests_refused.labels(endpoint, "temporal_unavailable").inc()
        retry = self._retry_after_s
        return ApiError(
            503,
            "temporal_unavailable",
            {"error": "temporarily unavailable", "detail": str(e), "retry_after_s": retry},
            {"Retry-After": str(retry)},
        )

    def invalid(self, e: ValidationError, what: str, endpoint: str) -> ApiError:
        """422 naming each bad field (e.g. alerts[0].startsAt)."""
        self._metrics.requests_refused.labels(endpoint, "invalid").inc()
        problems = [
            {"field": _field_name(err["loc"]), "message": err["msg"]}
            for err in e.errors(include_url=False, include_input=False)
        ]
        fields = list(dict.fromkeys(p["field"] for p in problems))
        detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
        return ApiError(
            422,
            "invalid",
            {"error": f"invalid {what}", "fields": fields, "problems": problems, "detail": detail},
        )


def _field_name(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(body)"
