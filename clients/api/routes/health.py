"""`GET /healthz` (the process answers) and `GET /readyz` (Temporal can be reached):
always open, for the orchestrator's probes."""

from __future__ import annotations

from fastapi import APIRouter
from temporalio.client import Client

from autoclusters.clients.api.intake import TemporalUnavailable
from autoclusters.clients.api.state import ApiState


def router(api: ApiState) -> APIRouter:
    r = APIRouter()

    @r.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "temporal": "connected" if api.gate.connected else "not connected"}

    @r.get("/readyz", summary="Readiness: Temporal can be reached")
    async def readyz() -> dict[str, str]:
        async def check(client: Client) -> bool:
            return await client.service_client.check_health()

        if not await api.read(check, "readyz"):
            down = TemporalUnavailable("Temporal reports itself unhealthy")
            raise api.refusals.unavailable(down, "readyz")
        return {"status": "ready"}

    return r
