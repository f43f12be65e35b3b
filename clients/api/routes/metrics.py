"""`GET /metrics`: the API's Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from autoclusters.clients.api.state import ApiState
from autoclusters.core.net import is_loopback


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    @r.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        # Open to this machine while the API binds loopback (a sandbox); otherwise the
        # scraper shows a token (Prometheus: `authorization.credentials_file`).
        caller = request.client.host if request.client else None
        if not (is_loopback(settings.api_host) and is_loopback(caller)):
            api.checks.authorize(request, "metrics", "metrics")
        return Response(api.metrics.render(), media_type=api.metrics.content_type)

    return r
